"""Batches assembled where they are made (data.loader=buffers: packs and image folders
decoded on the CPU, and blocks of a token pack).

torch's DataLoader hands each batch from a worker to the training process through a fresh
shared-memory segment: the worker stacks its samples into it (a copy), sends its handle, the
training process maps it and the pages fault in on both sides. Per 224-px image that cost
0.1 ms here against 0.73 ms of decoding (docs/benchmarks.md, data_stages); for blocks of
tokens, which cost almost nothing to read, it is most of the time. Here the batch buffers are
allocated in shared memory once, a few more than the batches in flight, and reused every step:
a worker renders each sample straight into its row (the resize or the flip writes into the
buffer, a token block is copied into it) and says only "batch n is ready". With pin=True (a
GPU run) the buffers are page-locked once, so the copy to the device is asynchronous with no
extra copy into pinned memory; a slot is refilled only after the copy from it was waited for.

A dataset renders into batch buffers when it has `row_layout(size) -> RowLayout` (one
sample's shape and dtype at the sampler's size, and whether it has a label: images yield
(rows, labels), token blocks their rows alone) and `render_rows(keys, rows) -> labels`
(the batch's samples written into `rows`; their labels, or None without).

The batches are the ones torch's loader gives: the same samples, crops and flips (views are
drawn from the sample keys alone: sampling.py), in order. A batch stays valid until two more
have been asked for, from its pass or the next; clone it to keep it longer. A pass starts
rendering when it is opened (`iter`), as torch's DataLoader does. A worker that dies is named
with how it died, never waited for forever; one that raises passes its error on.
"""

from __future__ import annotations

import dataclasses
import math
import os
import queue
import weakref
from collections import deque
from collections.abc import Iterator
from typing import NamedTuple

import torch
import torch.multiprocessing as mp

from hpctrain.data.sampling import SampleKey
from hpctrain.data.worker_death import how_it_died, worker_died
from hpctrain.data.worker_signals import blocked, spare_worker
from hpctrain.errors import DataError

HELD = 2  # batches the consumer may still read after asking for the next
POLL_SECONDS = 1.0  # how often a wait checks that the workers live


class RowLayout(NamedTuple):
    """One sample in a batch buffer: its shape and dtype, and whether a label comes with it."""
    shape: tuple[int, ...]
    dtype: torch.dtype
    labelled: bool = True

    @property
    def bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


class ImageRows:
    """For image datasets: rows of `size` x `size` x 3 uint8 (NHWC) with a label, rendered
    one sample at a time by the dataset's `render_into(key, out) -> label`."""

    def row_layout(self, size: int) -> RowLayout:
        return RowLayout((size, size, 3), torch.uint8)

    def render_rows(self, keys: list[SampleKey], rows: torch.Tensor) -> list[int]:
        return [self.render_into(key, row) for key, row in zip(keys, rows)]


ALIGN = 64  # each slot starts on a cache line, so that any dtype can view it


class SharedBatches:
    """`slots` batch buffers of `rows` samples of up to `row_bytes` each, and their labels."""

    def __init__(self, slots: int, rows: int, row_bytes: int, shared: bool):
        slot_bytes = -(-rows * row_bytes // ALIGN) * ALIGN
        self.data = _empty((slots, slot_bytes), torch.uint8, shared)
        self.labels = _empty((slots, rows), torch.int64, shared)
        self.pinned = False

    def rows(self, slot: int, count: int, layout: RowLayout) -> torch.Tensor:
        """The first `count` samples of `slot` laid out as `layout` says: a contiguous view."""
        return self.data[slot, :count * layout.bytes].view(layout.dtype).view(count,
                                                                              *layout.shape)

    def pin(self) -> None:
        """Page-lock the buffers for asynchronous copies to the GPU."""
        cudart = torch.cuda.cudart()
        status = cudart.cudaHostRegister(self.data.data_ptr(), self.data.numel(), 0)
        self.pinned = int(status) == 0

    def unpin(self) -> None:
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.data.data_ptr())
            self.pinned = False


def _empty(shape: tuple[int, int], dtype: torch.dtype, shared: bool) -> torch.Tensor:
    """An uninitialised tensor, made in shared memory where `shared` (share_memory_() would
    first make it in private memory and copy it over: 1.3 s for 270 MB here, 0.17 s so)."""
    if not shared:
        return torch.empty(shape, dtype=dtype)
    storage = torch.UntypedStorage._new_shared(math.prod(shape) * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)


def render(dataset, batches: SharedBatches, slot: int, keys: list[SampleKey]) -> None:
    layout = dataset.row_layout(keys[0].size)
    labels = dataset.render_rows(keys, batches.rows(slot, len(keys), layout))
    if layout.labelled:
        batches.labels[slot, :len(keys)] = torch.as_tensor(labels)


def _work(number: int, dataset, batches: SharedBatches, tasks, done, stop_signals,
          trainer: int) -> None:
    """A worker: render the batches it is given until told to stop, or until its parent is
    gone (a killed training process leaves no worker behind)."""
    spare_worker(stop_signals, number, trainer=trainer)
    torch.set_num_threads(1)
    parent = os.getppid()
    while True:
        try:
            task = tasks.get(timeout=POLL_SECONDS)
        except queue.Empty:
            if os.getppid() != parent:
                return
            continue
        if task is None:
            return
        batch, slot, keys = task
        try:
            render(dataset, batches, slot, keys)
            done.put((batch, None))
        except Exception as err:  # passed on to the training process, raised there
            done.put((batch, _portable(err)))


def _portable(err: Exception) -> Exception:
    """`err` if it survives pickling, else a DataError saying what it was."""
    import pickle

    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:
        return DataError(f"{type(err).__name__}: {err}")



class _Workers:
    """The worker processes, each with its own task queue, and one queue of finished
    batches."""

    def __init__(self, dataset, batches: SharedBatches, count: int, context: str | None,
                 stop_signals: tuple[str, ...]):
        ctx = mp.get_context(context)
        with blocked(stop_signals):  # the queues' helper and the workers: worker_signals.py
            self.done = ctx.Queue()
            self.tasks = [ctx.Queue() for _ in range(count)]
            self.processes = [ctx.Process(target=_work, daemon=True,
                                          name=f"hpctrain-input-{i}",
                                          args=(i, dataset, batches, self.tasks[i], self.done,
                                                stop_signals, os.getpid()))
                              for i in range(count)]
            for process in self.processes:
                process.start()

    def send(self, batch: int, slot: int, keys: list[SampleKey]) -> None:
        self.tasks[batch % len(self.tasks)].put((batch, slot, keys))

    def finished(self, what: str) -> tuple[int, Exception | None]:
        """The next finished batch; DataPipelineFailed naming a worker that died meanwhile."""
        while True:
            try:
                return self.done.get(timeout=POLL_SECONDS)
            except queue.Empty:
                for process in self.processes:
                    if not process.is_alive():
                        raise worker_died(process.pid, how_it_died(process.exitcode),
                                          what) from None

    def stop(self) -> None:
        for tasks in self.tasks:
            tasks.put(None)
        for process in self.processes:
            process.join(5)
            if process.is_alive():
                process.terminate()
                process.join(5)


class BufferedLoader:
    """A DataLoader for datasets that render into batch buffers (the module's docstring):
    yields (rows, labels) batches, or rows alone, of the keys `sampler` gives, rendered by
    `num_workers` processes (none: in this process) into shared batch buffers.

    The buffers hold workers x prefetch_factor + 3 batches of the largest sample size (the
    dataset's rows at `max_size`, the largest size the sampler will ask for). They
    live with the workers: for the whole run with persistent_workers (the training loader),
    for one pass without (the validation loader, whose batches are twice as large)."""

    def __init__(self, dataset, sampler, batch_size: int, drop_last: bool, num_workers: int,
                 max_size: int, prefetch_factor: int = 4, persistent_workers: bool = True,
                 stop_signals: tuple[str, ...] = ("SIGUSR1",), context: str | None = None,
                 pin: bool = False):
        self.dataset, self.sampler, self.batch_size = dataset, sampler, batch_size
        self.drop_last, self.num_workers = drop_last, num_workers
        self.persistent_workers, self.stop_signals = persistent_workers, tuple(stop_signals)
        self.context, self.pin_memory, self.max_size = context, pin, max_size
        self.prefetch_factor = prefetch_factor
        self.slots = max(1, num_workers * prefetch_factor) + HELD + 1
        # what the finaliser stops and frees with the loader
        self._live: dict = {"workers": None, "batches": None}
        self._unfinished: set[int] = set()  # batches sent by a pass that was left early
        self._numbers = 0  # batches are numbered across passes
        # the slots of the batches last handed out, which the consumer may still read (or
        # copy to the device from), with the copy's event: kept from one pass to the next
        self._held: deque[tuple[int, torch.cuda.Event | None]] = deque()
        weakref.finalize(self, _shut_down, self._live)

    @property
    def buffer_bytes(self) -> int:
        """What its batch buffers take, in shared memory (and page-locked, pinned)."""
        return self.slots * self.batch_size * self.dataset.row_layout(self.max_size).bytes

    @property
    def _workers(self) -> _Workers | None:
        return self._live["workers"]

    @property
    def batches(self) -> SharedBatches:
        if self._live["batches"] is None:
            row_bytes = self.dataset.row_layout(self.max_size).bytes
            self._live["batches"] = SharedBatches(self.slots, self.batch_size, row_bytes,
                                                  shared=self.num_workers > 0)
            if self.pin_memory:
                self._live["batches"].pin()
        return self._live["batches"]

    def __len__(self) -> int:
        count = len(self.sampler)
        return count // self.batch_size if self.drop_last else math.ceil(count / self.batch_size)

    def _key_batches(self) -> Iterator[list[SampleKey]]:
        batch = []
        for key in self.sampler:
            batch.append(key)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor] | torch.Tensor]:
        """A pass over the sampler's keys, its first batches sent to the workers now (as
        torch's DataLoader does when its iterator is made): a pass opened before the step
        that asks for its first batch, during an evaluation, finds it ready."""
        if self.num_workers == 0:
            return self._inline()
        if self._workers is None:
            self._live["workers"] = _Workers(self.dataset, self.batches, self.num_workers,
                                             self.context, self.stop_signals)
        self._drain()
        in_use = {slot for slot, _ in self._held}  # the last pass's batches may still be read
        opened = _Opened(self._key_batches(),
                         deque(slot for slot in range(self.slots) if slot not in in_use))
        self._send(opened)
        return self._pass(opened)

    def _inline(self):
        for number, keys in enumerate(self._key_batches()):
            slot = number % self.slots
            render(self.dataset, self.batches, slot, keys)
            yield self._batch(slot, keys)

    def _batch(self, slot: int, keys: list[SampleKey]):
        layout = self.dataset.row_layout(keys[0].size)
        rows = self.batches.rows(slot, len(keys), layout)
        if not layout.labelled:
            return rows
        return rows, self.batches.labels[slot, :len(keys)].clone()

    def _drain(self) -> None:
        """Wait for the batches an earlier pass sent and left unread: their workers are
        still writing into the buffers this pass will reuse."""
        while self._unfinished:
            batch, _ = self._workers.finished("a batch of an earlier pass")
            self._unfinished.discard(batch)

    def _send(self, opened: "_Opened") -> None:
        """The pass's next keys to the workers, a batch into each free slot."""
        while opened.free and (chunk := next(opened.keys, None)) is not None:
            number, slot = self._numbers, opened.free.popleft()
            self._numbers += 1
            self._workers.send(number, slot, chunk)
            opened.sent.append((number, slot, chunk))
            self._unfinished.add(number)

    def _pass(self, opened: "_Opened"):
        workers, batches, held = self._workers, self.batches, self._held
        ready: dict[int, Exception | None] = {}
        try:
            while opened.sent:
                number, slot, chunk = opened.sent.popleft()
                while number not in ready:
                    batch, error = workers.finished(f"batch {number}")
                    ready[batch] = error
                    self._unfinished.discard(batch)
                error = ready.pop(number)
                if error is not None:
                    raise error
                yield self._batch(slot, chunk)
                held.append((slot, _copy_event(batches)))
                while len(held) > HELD:
                    reused, event = held.popleft()
                    if event is not None:
                        event.synchronize()  # the device copy from it is done
                    opened.free.append(reused)
                self._send(opened)
        finally:
            if not self.persistent_workers and not self._unfinished:
                self.close()

    def close(self) -> None:
        """Stop the workers and free the buffers (made again by the next pass)."""
        _shut_down(self._live)
        self._unfinished.clear()
        self._held.clear()


@dataclasses.dataclass
class _Opened:
    """A pass under way: the keys still to send, the slots free for them, and the batches
    sent, in order (number, slot, keys)."""
    keys: Iterator[list[SampleKey]]
    free: deque
    sent: deque = dataclasses.field(default_factory=deque)


def _copy_event(batches: SharedBatches):
    """On pinned buffers, an event after whatever the consumer queued on the device from the
    batch it just finished with."""
    if not batches.pinned:
        return None
    event = torch.cuda.Event()
    event.record()
    return event


def _shut_down(live: dict) -> None:
    if live["workers"] is not None:
        live["workers"].stop()
        live["workers"] = None
    if live["batches"] is not None:
        live["batches"].unpin()
        live["batches"] = None

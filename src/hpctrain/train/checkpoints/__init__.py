"""Checkpoints: the format (DCP, atomic), the check before a resume, what a resume restores, where
a run lives and which checkpoint it resumes from, and the run's progress they carry."""

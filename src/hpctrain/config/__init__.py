"""The recipe: its schema, one module per section, and its loading (loading.py).

Its public face is here, so a room asks `hpctrain.config` and not the file a section
happens to live in.
"""

from hpctrain.config.base import plain_name
from hpctrain.config.loading import (code_references, current_names, flatten, from_defaults,
                                     load_config, parse_override, read_yaml_mapping,
                                     shipped_recipes, to_yaml, with_settings)
from hpctrain.config.operation_settings import PreemptionConfig
from hpctrain.config.parallel_settings import Strategy
from hpctrain.config.recipe import Config
from hpctrain.config.task_settings import TaskConfig
from hpctrain.config.training_settings import OptimConfig, ScheduleConfig
from hpctrain.data.kinds import sections
from hpctrain.data.settings import DataConfig

# the images' augmentation section, which tests and benchmarks build alone
AugmentConfig = sections()["augment"]

__all__ = ["AugmentConfig", "Config", "DataConfig", "OptimConfig",
           "PreemptionConfig", "ScheduleConfig", "Strategy", "TaskConfig", "code_references",
           "current_names", "flatten", "from_defaults", "load_config", "parse_override",
           "plain_name", "read_yaml_mapping", "shipped_recipes", "to_yaml", "with_settings"]

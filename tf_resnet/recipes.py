"""The recipes and presets, read where they used to live.

They are `tf_resnet.config.presets` now; this name stays while the job
scripts' tests import it from here.
"""

from tf_resnet.config.presets import PRESETS, RECIPES

__all__ = ["PRESETS", "RECIPES"]

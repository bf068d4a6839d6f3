"""verl's own Hydra composition of a command: what `python3 -m <verl main> ...` would load.

Needs hydra-core and the verl package installed (not verl's GPU dependencies: the package is found
with importlib without importing it). Used to prove rendered commands load (the round-trip tests,
the end-to-end test's winner) and by the test bed's stand-in for verl's trainer main, which refuses
overrides the way verl would.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Sequence

from .verl import CONFIG_DIRS, _Cmd, verl


def verl_root() -> str:
    """The installed verl package's directory (its trainer/config holds the Hydra configs)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("verl is not installed (pip install --no-deps verl==0.9.1)")
    return os.path.dirname(spec.origin)


def compose(command: Sequence[str]):
    """The composed OmegaConf config of a verl command (entry point, --config-name, overrides);
    raises hydra's errors for keys or values verl's config does not accept."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    c = _Cmd(command)
    mode = c.mode
    name = c.config_name or verl.config_name(mode, verl.backend(command))
    root = verl_root()
    GlobalHydra.instance().clear()
    # the experimental configs find ppo_trainer through hydra.searchpath (pkg://verl.trainer.config or a
    # path relative to verl's repository); point it at the installed package's directory instead
    search = f"hydra.searchpath=[file://{root}/trainer/config]"
    with initialize_config_dir(config_dir=os.path.join(root, CONFIG_DIRS[mode]), version_base=None):
        return hydra_compose(config_name=name, overrides=[*c.overrides, search])

"""One configuration for a dnb broker: :class:`DnbConfig`, loaded by :func:`load_config`
from a TOML file, ``DNB_<SECTION>_<KEY>`` variables and flags (see docs/CONFIG.md)."""
from tiered.config.errors import ConfigError
from tiered.config.loader import LoadedConfig, from_toml, load_config
from tiered.config.model import DnbConfig

__all__ = ["ConfigError", "DnbConfig", "LoadedConfig", "from_toml", "load_config"]

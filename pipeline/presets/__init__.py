"""The shipped presets: complete params.yaml files (`<name>.yaml` in this package), one per setup; `cedar preset
NAME` writes one over params.yaml."""

from __future__ import annotations

from importlib import resources

from pipeline.config import ParamsError


def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in resources.files(__name__).iterdir() if p.name.endswith(".yaml"))


def preset_text(name: str) -> str:
    """The text of preset `name`; ParamsError naming the available ones for an unknown name."""
    if name not in preset_names():
        raise ParamsError(f"unknown preset {name!r}; available: {', '.join(preset_names())}")
    return resources.files(__name__).joinpath(f"{name}.yaml").read_text()

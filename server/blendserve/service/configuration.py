"""The configuration reference: every setting, its variable, flag, default and meaning.

``docs/configuration.md`` is this module's output (``python -m
blendserve.service.configuration > docs/configuration.md``); a test fails
when the two differ, so the reference cannot fall behind the settings.
"""

from __future__ import annotations

from pydantic.fields import FieldInfo

from blendserve.service.settings import Settings

__all__ = ["reference"]

_HEADER = """\
# Configuration

Generated from `blendserve.service.settings.Settings` by
`python -m blendserve.service.configuration > docs/configuration.md`; a test
fails when this page falls behind.

Every setting is read from its `BLENDSERVE_*` environment variable, and
`blendserve serve` takes it as a flag that overrides the variable
(`blendserve serve --help` lists the same). Lists take a comma-separated value
or a repeated flag (`--upstreams URL`, also spelled `--upstream URL`); a boolean
flag has a `--no-` form.

| Variable | Flag | Default | Meaning |
|---|---|---|---|
"""


def _default(field: FieldInfo) -> str:
    value = field.default
    if value is None or value == ():
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"`{value:g}`"
    return f"`{value}`"


def reference() -> str:
    """The Markdown page of every setting, in the order ``Settings`` declares them."""
    prefix = Settings.model_config.get("env_prefix", "")
    rows = []
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        meaning = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{prefix}{name.upper()}` | `{flag}` | {_default(field)} | {meaning} |\n")
    return _HEADER + "".join(rows)


if __name__ == "__main__":
    print(reference(), end="")

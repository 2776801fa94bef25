"""The command line every service's console script shares: ``--help`` prints what configures it, and exits.

A service is configured only through its environment (and secret files named there), so its command line
takes no options: ``temporality-<service> --help`` (or ``-h``) prints the service's description and every
environment variable its settings read, with its default, and exits 0 without connecting to anything; any
other argument is refused with the usage on stderr and exit code 2 (never a service started by mistake on
the machine's NATS). A service with commands of its own (``temporality-journal rebuild``) passes them in
``commands``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import NoReturn

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from temporality_protocol.catalog import ServiceSpec

__all__ = ["check_arguments", "help_text", "settings_variables"]

#: A default longer than this is shown cut (a long list of patterns says nothing in a terminal).
_MAX_DEFAULT = 60


def settings_variables(settings_type: type[BaseSettings], prefix: str | None = None) -> Iterator[tuple[str, str, str]]:
    """``(variable, default, description)`` for every setting of ``settings_type``, nested groups (settings of
    their own prefix: ``TEMPORALITY_NATS_*``, ``TEMPORALITY_LOG_*``, ...) included, in declaration order."""
    own = settings_type.model_config.get("env_prefix", "") if prefix is None else prefix
    for name, field in settings_type.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseSettings):
            yield from settings_variables(kind)
            continue
        yield f"{own}{name}".upper(), _default(field), _description(field)


def _default(field: FieldInfo) -> str:
    if field.default is PydanticUndefined:
        return "(required)" if field.default_factory is None else ""
    value = field.default
    if value is None:
        return ""
    if isinstance(value, SecretStr):
        return "(set)"
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return text if len(text) <= _MAX_DEFAULT else text[: _MAX_DEFAULT - 1] + "…"


def _description(field: FieldInfo) -> str:
    return " ".join((field.description or "").split())


def help_text(spec: ServiceSpec, settings_type: type[BaseSettings], commands: Mapping[str, str] | None = None) -> str:
    """What ``temporality-<service> --help`` prints."""
    lines = [usage(spec, commands), "", f"{spec.description}", ""]
    if commands:
        lines += ["commands:", *(f"  {name:<12} {what}" for name, what in commands.items()), ""]
    lines += [
        "Without arguments it runs the service until SIGTERM or SIGINT. It is configured only through the",
        "environment (a secret through a *_FILE variable naming a file); these are the variables it reads",
        "(default after '='; docs/operations.md explains them):",
        "",
    ]
    for variable, default, description in settings_variables(settings_type):
        lines.append(f"  {variable}={default}")
        if description:
            lines.append(f"      {description}")
    lines += ["", "Tracing reads the standard OTEL_* variables (off unless an OTLP endpoint is set)."]
    return "\n".join(lines) + "\n"


def usage(spec: ServiceSpec, commands: Mapping[str, str] | None = None) -> str:
    choices = f" [{' | '.join(commands)}]" if commands else ""
    return f"usage: temporality-{spec.name} [-h | --help]{choices}"


def check_arguments(
    spec: ServiceSpec,
    settings_type: type[BaseSettings],
    argv: Sequence[str] | None = None,
    commands: Mapping[str, str] | None = None,
) -> str | None:
    """The command given (one of ``commands``), or ``None`` to run the service; ``--help`` prints
    :func:`help_text` and exits 0, anything else exits 2 with the usage on stderr."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        return None
    if args[0] in ("-h", "--help") and len(args) == 1:
        sys.stdout.write(help_text(spec, settings_type, commands))
        _exit(0)
    if commands and len(args) == 1 and args[0] in commands:
        return args[0]
    sys.stderr.write(f"{usage(spec, commands)}\nunexpected argument(s): {' '.join(args)}; see --help\n")
    _exit(2)


def _exit(code: int) -> NoReturn:
    sys.stdout.flush()
    sys.exit(code)

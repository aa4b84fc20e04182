"""The command lines of the scripts.

Those that work on a finished run (sample, evaluate, export) take ``key=value`` overrides onto a dataclass schema,
like Hydra but without creating an output folder, and a bare first argument names the run folder:
``scripts/evaluate.py outputs/RUN steps=50``. Those that take train.py's own overrides (verify_gradients,
precompute, benchmark) compose the training config with Hydra's compose API, again without an output folder.
Either way a bad value prints one paragraph and exits with ``errors.exit_code`` (2).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import TypeVar

import yaml
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from dit_trainer.config import TrainConfig, check_fields, register_configs
from dit_trainer.config.command_line import check_command_line, closest_keys, refused_value
from dit_trainer.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, USER_ERRORS, ConfigError, exit_code
from dit_trainer.run_config import compose_train_config

# A bad override (an unknown key, a value of the wrong type) is bad input too.
PARSE_ERRORS = (HydraException, OmegaConfBaseException)

T = TypeVar("T")


class _NotGiven:
    """The value of an argument left off the command line, as an error names it."""

    def __repr__(self) -> str:
        return "not given"


NOT_GIVEN = _NotGiven()


def parse_cli(schema: type[T], argv: list[str], positional: str = "run_dir") -> T:
    """``argv`` (``key=value`` items, the first may be a bare value for ``positional``) merged onto ``schema`` and
    field-checked. A key the schema lacks, a value of the wrong type or one its field refuses is one paragraph
    naming it (OmegaConf's own errors are traceback-like blocks)."""
    if argv and "=" not in argv[0]:
        argv = [f"{positional}={argv[0]}", *argv[1:]]
    merged = OmegaConf.structured(schema)
    for item in argv:
        key, _, value = item.partition("=")
        try:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist([item]))
        except ConfigKeyError as error:
            closest = " or ".join(f"`{name}`" for name in closest_keys(key, [f.name for f in fields(schema)]))
            known = f"it is not an argument of this command{f' (the closest: {closest})' if closest else ''}"
            raise ConfigError(key, value, known, "correct the key (see the usage)") from error
        except ValidationError as error:
            raise refused_value(key, value, error, schema, "the usage (`--help`)") from error
        except (yaml.YAMLError, OmegaConfBaseException) as error:  # `prompts=[a, b` unclosed, `prompts.0=a`
            reason = " ".join(str(error).partition("\n")[0].split())
            raise ConfigError(
                key,
                value,
                f"it cannot be read as this argument's value ({reason})",
                "write a list whole (`prompts='[a cat,a dog]'`), and a text that starts with a sign YAML reads (@, %, "
                f"`, [, {{) in quotes that reach the command (`{key}='\"{value}\"'`)",
            ) from error
    missing = sorted(OmegaConf.missing_keys(merged), key=lambda name: (name != positional, name))
    if missing:  # named here, the first argument first: OmegaConf's own error is a traceback-like block
        key, first = missing[0], ", or give it as the first argument" if missing[0] == positional else ""
        raise ConfigError(key, NOT_GIVEN, "it has no default", f"add `{key}=...` to the command{first} (see the usage)")
    parsed = OmegaConf.to_object(merged)
    check_fields(parsed)
    return parsed


def _report(main: Callable[[], tuple[str, int]], usage: str | None = None) -> int:
    """Run ``main``, print its message and return its exit code; a user error prints one paragraph (and the
    usage) to stderr and returns the error's exit code, and Ctrl-C one line and 130, as train.py does."""
    try:
        message, code = main()
    except (*USER_ERRORS, *PARSE_ERRORS) as error:
        print(f"error: {error}" + (f"\n\n{usage}" if usage else ""), file=sys.stderr)
        return EXIT_BAD_INPUT if isinstance(error, PARSE_ERRORS) else exit_code(error)
    except KeyboardInterrupt:
        print("Stopped by Ctrl-C.", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(message)
    return code


def run_cli(main: Callable[[T], str], schema: type[T], argv: list[str], usage: str) -> int:
    """Parse ``argv`` onto ``schema``, run ``main`` and print what it returns; ``-h``/``--help`` prints ``usage``."""
    if {"-h", "--help"} & set(argv):
        print(usage)
        return 0
    register_configs()
    return _report(lambda: (main(parse_cli(schema, argv)), 0), usage)


def run_train_script(
    config_dir: Path, overrides: list[str], main: Callable[[TrainConfig], tuple[str, int]], usage: str
) -> int:
    """Compose ``overrides`` as ``train.py`` would (their keys and value types checked first, as train.py checks
    them), run ``main`` on the config and print its message; returns its exit code. ``-h``/``--help`` prints the
    script's ``usage``; another flag is refused (Hydra's lexer would call it a syntax error)."""
    if {"-h", "--help"} & set(overrides):
        print(usage)
        return 0
    if flags := [item for item in overrides if item.startswith("-") and "=" not in item]:
        print(f"error: unknown option {flags[0]} (the options and overrides it takes: --help)", file=sys.stderr)
        return EXIT_BAD_INPUT

    def composed() -> TrainConfig:
        check_command_line(overrides, config_dir)
        return compose_train_config(config_dir, overrides)

    return _report(lambda: main(composed()))

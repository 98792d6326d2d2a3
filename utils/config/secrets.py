"""What of a config and a command line may be written down: never a credential.

A run writes its config and command line into checkpoints, ``provenance.json``,
``metrics.json``, ``.hydra/``, the log and every tracker (MLflow params and artifacts, W&B).
A value the config reads from the environment (``${oc.env:SLACK_TOKEN}``) is recorded as that
interpolation, unresolved, and the value of any key that names a secret (``*token*``,
``*secret*``, ``*password*``, ``*passphrase*``, ``pwd``, ``*auth*``, ``*api_key*``,
``*credential*``, ...) as :data:`REDACTED`, in the config and on the command line alike
(``logger.mlflow.token=abc`` is recorded ``logger.mlflow.token=<redacted>``); so is the password
of a URL in any value or argument (``data.path=s3://KEY:SECRET@bucket/set`` is recorded
``s3://KEY:<redacted>@bucket/set``; log and error lines redact it too, utils/text.py). The
process itself still builds from the real values.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from utils.files import write_file
from utils.text import REDACTED, url_passwords, without_url_passwords

# "token", but not "tokenizer" (data.tokenizer names a file), nor a token's id or count
# (pad_token_id, token_type_ids, max_new_tokens: an encoder's architecture, model=hf).
# "auth", but not "author"; "pwd", but not as part of another word.
SECRET_KEY = re.compile(
    r"token(?!iz|s\b|_?(type_)?ids?\b)|secret|passw(or)?d|passphrase|(?<![a-z])pwd(?![a-z])"
    r"|auth(?!ors?\b)|api[_-]?key|credential|private[_-]?key|access[_-]?key",
    re.IGNORECASE,
)
ENVIRONMENT = re.compile(r"\$\{\s*oc\.env\s*:")
SHORTEST_SECRET = 4  # characters: a shorter value is not searched for inside other strings


def names_a_secret(key: Any) -> bool:
    """Whether the last part of a dotted ``key`` names a credential."""
    return isinstance(key, str) and bool(SECRET_KEY.search(re.split(r"[./]", key)[-1]))


def recorded(cfg: DictConfig) -> dict:
    """The config as plain containers, resolved, but with every value that reads the
    environment left as its interpolation and every secret-named key's value redacted: what a
    checkpoint, a record or a tracker may hold."""
    return _recorded(cfg)[0]


def secret_values(cfg: DictConfig) -> list[str]:
    """The resolved values the record leaves out (secret-named keys', and those read from the
    environment), longest first, to be taken out of any other text a run writes."""
    found = _recorded(cfg)[1]
    return sorted((v for v in found if len(v) >= SHORTEST_SECRET), key=len, reverse=True)


def _recorded(cfg: DictConfig) -> tuple[dict, set[str]]:
    """(the record of the config, the values it left out), in one walk of the resolved
    config beside the config as written."""
    found: set[str] = set()

    def walk(resolved: Any, raw: Any, key: Any = None) -> Any:
        if isinstance(resolved, dict) and isinstance(raw, dict):
            return {k: walk(v, raw.get(k), k) for k, v in resolved.items()}
        if isinstance(resolved, list) and isinstance(raw, list) and len(raw) == len(resolved):
            return [walk(v, r, key) for v, r in zip(resolved, raw, strict=True)]
        from_environment = isinstance(raw, str) and ENVIRONMENT.search(raw)
        secret = names_a_secret(key) and resolved not in (None, "", REDACTED)
        if (from_environment or secret) and not isinstance(resolved, bool | dict | list):
            found.add(str(resolved))
        if from_environment:
            return raw
        if isinstance(resolved, str) and not secret:  # a URL's password, wherever it is
            found.update(url_passwords(resolved))
            return without_url_passwords(resolved)
        return REDACTED if secret and not isinstance(resolved, dict | list) else resolved

    resolved = OmegaConf.to_container(cfg, resolve=True)
    return walk(resolved, OmegaConf.to_container(cfg, resolve=False)), found


def scrubbed(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets``, and every URL's password, replaced by
    :data:`REDACTED`."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return without_url_passwords(text)


def redacted_argv(argv: Iterable[str], secrets: Iterable[str] = ()) -> list[str]:
    """A command line as it may be recorded: ``key=value`` with a secret-named key, and
    ``--token value`` / ``--token=value`` flags, keep the key and lose the value; any of
    ``secrets`` inside another argument is redacted too."""
    secrets = list(secrets)
    shown: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            shown.append(REDACTED)
            hide_next = False
            continue
        key, equals, _ = arg.partition("=")
        if equals and names_a_secret(key.lstrip("+~-")):
            shown.append(f"{key}={REDACTED}")
            continue
        hide_next = arg.startswith("-") and not equals and names_a_secret(arg.lstrip("-"))
        shown.append(scrubbed(arg, secrets))
    return shown


def redacted(node: Any, secrets: Iterable[str] = (), key: Any = None) -> Any:
    """Plain containers ``node`` with secret-named keys' values and ``secrets`` redacted."""
    secrets = list(secrets)
    if isinstance(node, dict):
        return {k: redacted(v, secrets, k) for k, v in node.items()}
    if isinstance(node, list):
        return [redacted(v, secrets, key) for v in node]
    if names_a_secret(key) and node not in (None, "", REDACTED):
        return REDACTED
    if isinstance(node, str):
        if "=" in node and names_a_secret(node.partition("=")[0].lstrip("+~-")):
            return f"{node.partition('=')[0]}={REDACTED}"
        return scrubbed(node, secrets)
    return node


def scrub_yaml_files(paths: Iterable[Path], secrets: Iterable[str]) -> None:
    """Rewrite the YAML files Hydra wrote (``.hydra/config.yaml``, ``overrides.yaml``,
    ``hydra.yaml``, a sweep's ``multirun.yaml``) without the secrets the command line or the
    environment put there; a file that needs no change is left as it is."""
    secrets = list(secrets)
    for path in paths:
        if not path.is_file():
            continue
        loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        clean = redacted(loaded, secrets)
        if clean != loaded:
            text = OmegaConf.to_yaml(OmegaConf.create(clean)).encode()
            write_file(path, text, "check that the run folder is writable")

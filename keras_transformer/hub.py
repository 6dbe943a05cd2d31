"""Preset handles on a model hub: `hf://org/name` and `hf://org/name@revision` (a branch, tag or commit), and one
GGUF file of a repository: `hf://org/name/file.gguf` and `hf://org/name/path/to/file.gguf@revision`.

The grammar keeps a revision and a file name apart: the repository id is the first two segments, a file is
everything after them up to the `@`, and it must end in `.gguf`; the revision is everything after the `@` (it may
hold `/`, as `refs/pr/1` does; neither a repository id nor a file name may hold `@`). So the file always comes
before the revision: `hf://org/name@main/file.gguf` is refused with the handle it should be. A split GGUF
(`...-00001-of-00003.gguf`) downloads all its parts.

`presets.resolve` hands a handle to `resolve_handle`, which downloads the files a preset needs with
`huggingface_hub.snapshot_download` into the hub's standard cache and returns the snapshot directory.
That directory then loads like a local one: a Hugging Face checkpoint (config.json with a
`model_type`) is converted on the fly, a keras_transformer preset (config.json with a `backbone`
entry) loads as saved.

`huggingface_hub` does the rest, as it does for `transformers`: a file already in the cache is never
fetched again, `HF_HUB_OFFLINE=1` reads the cache only, `HF_TOKEN` (or `hf auth login`) opens gated
and private repositories, `HF_HOME` / `HF_HUB_CACHE` move the cache and `HF_ENDPOINT` picks a mirror.

Example:
>>> # Downloads from the Hugging Face Hub (the network): not run by the tests.
>>> lm = kt.models.CausalLM.from_preset("hf://Qwen/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q8_0.gguf")  # doctest: +SKIP
>>> import keras_transformer as kt  # doctest: +SKIP
>>> lm = kt.models.GPTCausalLM.from_preset("hf://openai-community/gpt2")  # doctest: +SKIP
>>> lm = kt.models.GPTCausalLM.from_preset("hf://openai-community/gpt2@main")  # doctest: +SKIP
"""

import contextlib
import re
from pathlib import Path
from urllib.parse import unquote

from keras_transformer.version import __version__

SUPPORTED_SCHEMES = {"hf": "hf://org/name[@revision] or hf://org/name/file.gguf[@revision] (Hugging Face Hub)"}

# What a preset reads: a Hugging Face checkpoint's files (safetensors weights, single or sharded under
# transformers' `model-00001-of-00002.safetensors` names; tokenizer and chat template) and our own
# preset format's. Hub repositories often also hold copies of the weights we do not read (PyTorch,
# TF, Flax, ONNX, Mistral's consolidated.safetensors, subfolders): those are never downloaded.
ALLOW_PATTERNS = [
    "config.json",
    "model*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "model.weights.h5",  # keras_transformer presets (see presets/zoo.py)
    "task.weights.h5",
    "metadata.json",
    "modules.json",  # sentence-transformers folders (convert/sentence_transformers.py)
    "sentence_bert_config.json",
    "*_Pooling/config.json",
]
# Top-level files only, but a sentence-transformers Pooling config: the one wildcard above that could reach into
# a subfolder is model*.safetensors'.
IGNORE_PATTERNS = ["*/*.safetensors"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def handle_scheme(preset):
    """The scheme of a handle such as `hf://org/name` ("hf"), or None for a name or a path."""
    match = _SCHEME.match(preset)
    return match.group(1).lower() if match else None


def resolve_handle(handle):
    """`hf://org/name[@revision]` -> the local snapshot directory (Path), downloading what is missing;
    `hf://org/name/file.gguf[@revision]` -> the local file (Path), all its parts when it is split.

    Raises a ValueError naming what is missing: an unsupported scheme, the repository, the revision,
    a file, or a cache entry when downloading is off (`HF_HUB_OFFLINE=1`) or the hub cannot be reached.
    """
    scheme = handle_scheme(handle)
    if scheme not in SUPPORTED_SCHEMES:
        raise ValueError(
            f"Unsupported preset scheme {scheme + '://'!r} in {handle!r}. Supported: "
            f"{', '.join(SUPPORTED_SCHEMES.values())}; or a registered preset name, or a local directory."
        )
    repo_id, revision, filename = parse_handle(handle)
    if filename is not None:
        return _download_gguf(handle, repo_id, revision, filename)
    directory = _download(handle, repo_id, revision)
    if not (directory / "config.json").is_file():
        found = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
        raise ValueError(
            f"{handle!r} has no config.json (revision {revision!r}), so it is neither a keras_transformer "
            f"preset nor a Hugging Face checkpoint. Files found among those a preset reads: {found or 'none'}."
        )
    return directory


def parse_handle(handle):
    """ "hf://org/name[/file.gguf][@rev]" -> ("org/name", "rev", "file.gguf" or None); the revision defaults to
    "main". See the module docstring for the grammar."""
    body = handle[len("hf://") :]
    left, at, revision = body.partition(
        "@"
    )  # neither a repository id nor a file name holds "@"; a revision may hold "/"
    if revision.lower().endswith(".gguf") and "/" in revision:
        right = revision.split("/")
        raise ValueError(
            f"Malformed Hugging Face handle {handle!r}: it reads as the revision {revision!r}. A file goes before the "
            f"revision: hf://{left}/{'/'.join(right[1:])}@{right[0]}"
        )
    segments = left.split("/")
    filename = None
    if left.lower().endswith(".gguf") and len(segments) >= 3:
        left, filename = "/".join(segments[:2]), "/".join(segments[2:])
    if not _REPO_ID.fullmatch(left) or (at and not revision) or (filename is None and left.lower().endswith(".gguf")):
        raise ValueError(
            f"Malformed Hugging Face handle {handle!r}: expected hf://org/name, hf://org/name@revision "
            "(a branch, tag or commit hash) or hf://org/name/file.gguf[@revision]."
        )
    return left, revision or "main", filename


def _download_gguf(handle, repo_id, revision, filename):
    """The GGUF file `filename` of the repository (every part of a split one), in the hub's cache."""
    match = re.match(r"^(.*)-00001-of-(\d{5})\.gguf$", filename)
    names = (
        [filename] if match is None else [f"{match[1]}-{i:05d}-of-{match[2]}.gguf" for i in range(1, int(match[2]) + 1)]
    )
    paths = []
    with _translated_errors(handle, repo_id, revision):
        for name in names:
            paths.append(Path(_download_file(repo_id, name, revision)))
    return paths[0]


def _download_file(repo_id, filename, revision):
    import huggingface_hub

    return huggingface_hub.hf_hub_download(
        repo_id, filename, revision=revision, library_name="keras_transformer", library_version=__version__
    )


def _download(handle, repo_id, revision):
    import huggingface_hub

    with _translated_errors(handle, repo_id, revision):
        # No `token` argument: huggingface_hub then reads HF_TOKEN, or the token `hf auth login` stored.
        path = huggingface_hub.snapshot_download(
            repo_id,
            revision=revision,
            allow_patterns=ALLOW_PATTERNS,
            ignore_patterns=IGNORE_PATTERNS,
            library_name="keras_transformer",
            library_version=__version__,
        )
    return Path(path)


@contextlib.contextmanager
def _translated_errors(handle, repo_id, revision):
    """The hub client's errors as ValueErrors naming what is missing and what to do."""
    from huggingface_hub import constants, errors

    try:
        yield
    except errors.GatedRepoError as error:
        raise ValueError(
            f"{handle!r}: the repository {repo_id!r} is gated. Accept its terms at {constants.ENDPOINT}/{repo_id} "
            "and set HF_TOKEN to a token of that account (or run `hf auth login`)."
        ) from error
    except errors.RepositoryNotFoundError as error:  # the hub says so for private repositories, too
        raise ValueError(
            f"{handle!r}: no repository {repo_id!r} at {constants.ENDPOINT}. If it is private, set HF_TOKEN "
            "to a token with access to it (or run `hf auth login`)."
        ) from error
    except errors.RevisionNotFoundError as error:
        raise ValueError(f"{handle!r}: the repository {repo_id!r} has no revision {revision!r}.") from error
    except errors.RemoteEntryNotFoundError as error:  # listed in the repository, yet not served
        raise ValueError(
            f"{handle!r}: the file {_filename(error)!r} of revision {revision!r} is missing on the hub "
            f"({error.response.request.url})."
        ) from error
    except errors.LocalEntryNotFoundError as error:  # nothing downloaded, and not (completely) in the cache
        reason = (
            "HF_HUB_OFFLINE=1 forbids downloading it: load it once online, or unset HF_HUB_OFFLINE"
            if constants.is_offline_mode()
            else f"the hub could not be reached ({_first_line(error.__cause__ or error)})"
        )
        cached = "only partly" if isinstance(error, errors.IncompleteSnapshotError) else "not"
        raise ValueError(
            f"{handle!r} (revision {revision!r}) is {cached} in the Hugging Face cache {constants.HF_HUB_CACHE}, "
            f"and {reason}."
        ) from error
    except errors.HfHubHTTPError as error:
        raise ValueError(f"{handle!r}: the hub at {constants.ENDPOINT} answered {_first_line(error)}") from error


def _filename(error):
    """The repository file a failed `.../resolve/{revision}/{filename}` request asked for."""
    _, _, rest = unquote(error.response.request.url.path).partition("/resolve/")
    return rest.partition("/")[2] or "?"


def _first_line(error):
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__

"""`hf://org/name[@revision]` presets (keras_transformer/hub.py), against a local server that answers as the hub does.

The server (a thread on 127.0.0.1, random port) implements what `huggingface_hub.snapshot_download` calls:
the revision info (`/api/models/{repo}/revision/{rev}`), the file listing (`/api/models/{repo}/tree/{rev}`)
and the files (HEAD and GET `/{repo}/resolve/{rev}/{file}`, with ETag, X-Repo-Commit and Content-Length),
answering errors with the hub's codes (X-Error-Code: RepoNotFound, RevisionNotFound, EntryNotFound,
GatedRepo). huggingface_hub reads HF_ENDPOINT, HF_HUB_CACHE and HF_HUB_OFFLINE when it is imported, so
each test patches its constants, with a fresh cache. It publishes a random `transformers` GPT-2
checkpoint (two revisions) and the same model saved as a keras_transformer preset.
"""

import hashlib
import json
import re
import socket
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import constants

import keras_transformer as kt
from keras_transformer import cli, export
from keras_transformer.models import GPTBackbone, GPTCausalLM
from tests.conftest import to_numpy
from tests.convert import hf_models

REPO = "org/tiny-gpt2"


# --- a local hub -------------------------------------------------------------


class FakeHub:
    """Repositories in memory, and every request the server received."""

    def __init__(self):
        self.repos = {}  # repo id -> {"refs": {branch or tag: commit}, "commits": {commit: {filename: bytes}}}
        self.tokens = {}  # repo id -> the token a gated repository asks for
        self.withheld = set()  # filenames listed in the tree whose download answers 404 (a broken repository)
        self.requests = []  # (method, path, Authorization header)

    def publish(self, repo_id, directory=None, revision="main", extra=None):
        """Commit the files of `directory` (plus `extra`, {path: bytes}) as `revision`; returns the commit hash."""
        files = {p.name: p.read_bytes() for p in sorted(Path(directory).iterdir()) if p.is_file()} if directory else {}
        files.update(extra or {})
        commit = hashlib.sha1(repr((repo_id, revision, sorted(files.items()))).encode()).hexdigest()
        repo = self.repos.setdefault(repo_id, {"refs": {}, "commits": {}})
        repo["refs"][revision] = commit
        repo["commits"][commit] = files
        return commit

    def downloads(self):
        """The files requested (HEAD or GET), by name."""
        return [path.rsplit("/resolve/", 1)[1].split("/", 1)[1] for _, path, _ in self.requests if "/resolve/" in path]


_API = re.compile(r"/api/models/(?P<repo>[^/]+/[^/]+|[^/]+)/(?P<kind>revision|tree)/(?P<rev>[^/]+)")
_RESOLVE = re.compile(r"/(?P<repo>[^/]+/[^/]+|[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)")


def _handler(hub):
    class Handler(BaseHTTPRequestHandler):
        def do_HEAD(self):
            self._answer(send_body=False)

        def do_GET(self):
            self._answer(send_body=True)

        def log_message(self, *args):
            pass

        def _answer(self, send_body):
            path = urllib.parse.urlsplit(self.path).path
            hub.requests.append((self.command, path, self.headers.get("Authorization")))
            match = _API.fullmatch(path) or _RESOLVE.fullmatch(path)
            if match is None:
                return self._send(404, b"", {"X-Error-Code": "RepoNotFound"}, send_body)
            repo_id, revision = match["repo"], urllib.parse.unquote(match["rev"])
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._error(404, "RepoNotFound", f"Repository {repo_id} not found", send_body)
            commit = repo["refs"].get(revision, revision if revision in repo["commits"] else None)
            if commit is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", send_body)
            files = repo["commits"][commit]
            if "kind" in match.groupdict() and match["kind"] == "revision":
                info = {"id": repo_id, "sha": commit, "siblings": [{"rfilename": name} for name in files]}
                return self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, send_body)
            if "kind" in match.groupdict():  # the tree
                tree = [
                    {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                    for name, data in files.items()
                ]
                return self._send(200, json.dumps(tree).encode(), {"Content-Type": "application/json"}, send_body)
            # As on the hub, a gated repository's listing is public and its files need a token.
            if repo_id in hub.tokens and self.headers.get("Authorization") != f"Bearer {hub.tokens[repo_id]}":
                return self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted", send_body)
            filename = urllib.parse.unquote(match["file"])
            if filename not in files or filename in hub.withheld:
                return self._error(
                    404,
                    "EntryNotFound",
                    f"{filename} does not exist on {revision}",
                    send_body,
                    {"X-Repo-Commit": commit},
                )
            data = files[filename]
            headers = {
                "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
                "X-Repo-Commit": commit,
                "Content-Type": "application/octet-stream",
            }
            return self._send(200, data, headers, send_body)

        def _error(self, status, code, message, send_body, headers=None):
            headers = {
                "X-Error-Code": code,
                "X-Error-Message": message,
                "Content-Type": "application/json",
                **(headers or {}),
            }
            self._send(status, json.dumps({"error": message}).encode(), headers, send_body)

        def _send(self, status, body, headers, send_body):
            self.send_response(status)
            for name, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(name, value)
            self.end_headers()
            if send_body:
                self.wfile.write(body)

    return Handler


def _point_hub_at(monkeypatch, endpoint):
    monkeypatch.setenv("HF_ENDPOINT", endpoint)  # for child processes; this one read it at import
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A running FakeHub that huggingface_hub talks to, a fresh cache, no token, online."""
    fake = FakeHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    _point_hub_at(monkeypatch, f"http://127.0.0.1:{server.server_port}")
    cache = tmp_path / "hf_home" / "hub"
    monkeypatch.setenv("HF_HOME", str(cache.parent))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf_home" / "token"))  # no stored login
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    yield fake
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{"main", "v1"}: random GPT-2 checkpoints (different seeds); "preset": "main" saved as our preset."""
    root = tmp_path_factory.mktemp("hub_checkpoints")
    hf_models.gpt2(root / "main", seed=1)
    hf_models.gpt2(root / "v1", seed=2)
    GPTCausalLM.from_preset(root / "main").save_to_preset(root / "preset")
    return {name: root / name for name in ("main", "v1", "preset")}


def _inputs():
    token_ids = np.random.default_rng(0).integers(1, 200, (2, 7)).astype("int32")
    padding_mask = np.arange(7)[None, :] < np.array([[7], [4]])
    return {"token_ids": np.where(padding_mask, token_ids, 0).astype("int32"), "padding_mask": padding_mask}


def _logits(model):
    return to_numpy(model(_inputs()))


# --- loading -------------------------------------------------------------------


def test_hf_checkpoint_loads_as_the_local_directory(hub, checkpoints):
    hub.publish(REPO, checkpoints["main"])
    lm = GPTCausalLM.from_preset(f"hf://{REPO}")
    local = GPTCausalLM.from_preset(checkpoints["main"])
    np.testing.assert_array_equal(_logits(lm), _logits(local))
    text = "def add(a, b):"
    np.testing.assert_array_equal(lm.preprocessor.tokenizer.tokenize(text), local.preprocessor.tokenizer.tokenize(text))
    backbone = GPTBackbone.from_preset(f"hf://{REPO}")
    np.testing.assert_array_equal(
        to_numpy(backbone.token_embedding.embeddings), to_numpy(lm.backbone.token_embedding.embeddings)
    )
    # The snapshot lies in the hub's standard cache layout.
    snapshot = kt.presets.resolve(f"hf://{REPO}")
    assert snapshot.parent.parent == Path(constants.HF_HUB_CACHE) / "models--org--tiny-gpt2"
    assert (snapshot / "model.safetensors").is_file()


def test_keras_transformer_preset_repo_loads_directly(hub, checkpoints):
    hub.publish("org/kt-gpt", checkpoints["preset"])
    assert not list(checkpoints["preset"].glob("*.safetensors"))  # our format only: nothing to convert
    lm = GPTCausalLM.from_preset("hf://org/kt-gpt")
    np.testing.assert_array_equal(_logits(lm), _logits(GPTCausalLM.from_preset(checkpoints["preset"])))
    assert {"config.json", "model.weights.h5", "task.weights.h5", "tokenizer.json"} <= set(hub.downloads())
    # The export entry point takes a handle as every from_preset does.
    task = export.load_preset_task("hf://org/kt-gpt")
    np.testing.assert_array_equal(_logits(task), _logits(lm))


def test_base_class_picks_the_family_from_a_handle(hub, checkpoints):
    """`CausalLM.from_preset` picks the family (GPT-2's config: GPTCausalLM) from a directory and from a handle:
    an error here is a failure, not a reason to skip."""
    expected = kt.models.CausalLM.from_preset(checkpoints["main"])
    assert type(expected) is GPTCausalLM
    hub.publish(REPO, checkpoints["main"])
    lm = kt.models.CausalLM.from_preset(f"hf://{REPO}")
    assert type(lm) is type(expected)
    np.testing.assert_array_equal(_logits(lm), _logits(expected))


def test_second_load_downloads_nothing_and_only_what_a_preset_reads(hub, checkpoints):
    unread = {
        "pytorch_model.bin": b"not read",
        "flax_model.msgpack": b"not read",
        "README.md": b"# card",
        "consolidated.safetensors": b"a second copy",
        "onnx/model.safetensors": b"a subfolder",
    }
    hub.publish(REPO, checkpoints["main"], extra=unread)
    GPTCausalLM.from_preset(f"hf://{REPO}")
    first = hub.downloads()
    assert set(first) == {p.name for p in checkpoints["main"].iterdir()}  # what save_pretrained writes
    assert not set(unread) & set(first)
    assert len(first) == 2 * len(set(first))  # one HEAD and one GET per file, once
    requests_before = len(hub.requests)
    GPTCausalLM.from_preset(f"hf://{REPO}")
    assert hub.downloads() == first  # no file requested again
    assert all(path.startswith("/api/models/") for _, path, _ in hub.requests[requests_before:])


def test_revision_picks_that_revision(hub, checkpoints):
    hub.publish(REPO, checkpoints["main"])
    v1_commit = hub.publish(REPO, checkpoints["v1"], revision="v1")
    main = _logits(GPTCausalLM.from_preset(f"hf://{REPO}"))
    v1 = _logits(GPTCausalLM.from_preset(f"hf://{REPO}@v1"))
    np.testing.assert_array_equal(v1, _logits(GPTCausalLM.from_preset(checkpoints["v1"])))
    assert not np.allclose(main, v1)
    by_commit = kt.presets.resolve(f"hf://{REPO}@{v1_commit}")
    assert by_commit.name == v1_commit and by_commit == kt.presets.resolve(f"hf://{REPO}@v1")


def test_offline_mode_reads_the_cache_and_names_what_is_not_cached(hub, checkpoints, monkeypatch):
    hub.publish(REPO, checkpoints["main"])
    hub.publish(REPO, checkpoints["v1"], revision="v1")
    online = _logits(GPTCausalLM.from_preset(f"hf://{REPO}"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    requests_before = len(hub.requests)
    np.testing.assert_array_equal(_logits(GPTCausalLM.from_preset(f"hf://{REPO}")), online)
    assert len(hub.requests) == requests_before  # not one request
    with pytest.raises(ValueError, match=r"'hf://org/tiny-gpt2@v1'.*not in the Hugging Face cache.*HF_HUB_OFFLINE=1"):
        GPTCausalLM.from_preset(f"hf://{REPO}@v1")
    with pytest.raises(ValueError, match=r"'hf://org/other'.*not in the Hugging Face cache.*HF_HUB_OFFLINE=1"):
        GPTCausalLM.from_preset("hf://org/other")
    assert len(hub.requests) == requests_before


def test_unreachable_hub_names_the_missing_cache_entry(hub, checkpoints, monkeypatch):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    _point_hub_at(monkeypatch, f"http://127.0.0.1:{port}")
    with pytest.raises(ValueError, match=r"not in the Hugging Face cache.*could not be reached"):
        GPTCausalLM.from_preset(f"hf://{REPO}")


def test_token_from_the_environment_opens_a_gated_repository(hub, checkpoints, monkeypatch):
    hub.publish("org/gated", checkpoints["main"])
    hub.tokens["org/gated"] = "hf_secret"
    with pytest.raises(ValueError, match=r"'org/gated' is gated.*HF_TOKEN"):
        GPTCausalLM.from_preset("hf://org/gated")
    assert hub.requests and all(auth is None for _, _, auth in hub.requests)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    requests_before = len(hub.requests)
    lm = GPTCausalLM.from_preset("hf://org/gated")
    np.testing.assert_array_equal(_logits(lm), _logits(GPTCausalLM.from_preset(checkpoints["main"])))
    sent = hub.requests[requests_before:]
    assert any("/resolve/" in path for _, path, _ in sent)
    assert all(auth == "Bearer hf_secret" for _, _, auth in sent)


# --- clear errors ----------------------------------------------------------------


def test_missing_repository(hub):
    with pytest.raises(ValueError, match=r"no repository 'org/missing' at http://127\.0\.0\.1.*HF_TOKEN"):
        GPTCausalLM.from_preset("hf://org/missing")


def test_missing_revision(hub, checkpoints):
    hub.publish(REPO, checkpoints["main"])
    with pytest.raises(ValueError, match=r"'org/tiny-gpt2' has no revision 'nope'"):
        GPTCausalLM.from_preset(f"hf://{REPO}@nope")


def test_missing_files(hub, checkpoints):
    hub.publish("org/no-config", extra={"tokenizer.json": (checkpoints["main"] / "tokenizer.json").read_bytes()})
    with pytest.raises(ValueError, match=r"'hf://org/no-config' has no config.json.*\['tokenizer.json'\]"):
        GPTCausalLM.from_preset("hf://org/no-config")
    hub.publish("org/no-weights", extra={"config.json": (checkpoints["main"] / "config.json").read_bytes()})
    with pytest.raises(ValueError, match=r"No weights in the Hugging Face checkpoint .*model\.safetensors"):
        GPTBackbone.from_preset("hf://org/no-weights")
    hub.publish("org/broken", checkpoints["main"])
    hub.withheld.add("model.safetensors")  # listed, but the download answers 404
    missing = r"'hf://org/broken': the file 'model\.safetensors' of revision 'main' is missing"
    with pytest.raises(ValueError, match=missing):
        GPTCausalLM.from_preset("hf://org/broken")


@pytest.mark.parametrize(
    "preset, scheme",
    [
        ("kaggle://keras/gpt2/keras/gpt2_base_en", "kaggle://"),
        ("gs://bucket/gpt2", "gs://"),
        ("HTTPS://example.com/x", "https://"),
    ],
)
def test_unsupported_scheme_names_it_and_the_supported_ones(hub, preset, scheme):
    with pytest.raises(ValueError, match=rf"Unsupported preset scheme '{re.escape(scheme)}'.*hf://org/name"):
        GPTCausalLM.from_preset(preset)
    assert hub.requests == []


@pytest.mark.parametrize("handle", ["hf://", "hf://org/name/extra", "hf://org/name@", "hf://@main"])
def test_malformed_handle(hub, handle):
    with pytest.raises(ValueError, match=r"Malformed Hugging Face handle.*hf://org/name@revision"):
        GPTBackbone.from_preset(handle)
    assert hub.requests == []


# --- the command line --------------------------------------------------------------


def test_cli_convert_takes_a_handle(hub, checkpoints, tmp_path, capsys):
    hub.publish(REPO, checkpoints["main"])
    assert cli.main(["convert", f"hf://{REPO}", str(tmp_path / "preset")]) == 0
    assert "GPTCausalLM" in capsys.readouterr().out
    np.testing.assert_array_equal(
        _logits(GPTCausalLM.from_preset(tmp_path / "preset")), _logits(GPTCausalLM.from_preset(checkpoints["main"]))
    )
    assert cli.main(["convert", "kaggle://x/y", str(tmp_path / "out")]) == 2
    assert "Unsupported preset scheme 'kaggle://'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_sentence_transformers_folder_brings_its_pooling(hub, tmp_path):
    """A sentence-transformers repository: modules.json, sentence_bert_config.json and 1_Pooling/config.json come
    down with the checkpoint (the one subfolder file a preset reads), and it loads as a TextEmbedder."""
    folder = tmp_path / "st"
    hf_models.sentence_transformers_folder(folder, pooling="cls", normalize=True)
    pooling = {"1_Pooling/config.json": (folder / "1_Pooling" / "config.json").read_bytes()}
    hub.publish("org/tiny-st", folder, extra={**pooling, "onnx/model.onnx": b"not read"})
    embedder = kt.models.TextEmbedder.from_preset("hf://org/tiny-st")
    assert (type(embedder).__name__, embedder.pooling, embedder.normalize) == ("BertTextEmbedder", "cls", True)
    assert {"modules.json", "sentence_bert_config.json", "1_Pooling/config.json"} <= set(hub.downloads())
    assert "onnx/model.onnx" not in hub.downloads()
    local = kt.models.TextEmbedder.from_preset(folder)
    texts = ["the quick brown fox", "a dog"]
    np.testing.assert_array_equal(embedder.predict(texts, verbose=0), local.predict(texts, verbose=0))

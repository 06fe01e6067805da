"""A data prep that cannot reach the Hugging Face Hub (no network, offline mode, the Hub's own 5xx) fails as the
machine's failure: one line, exit 1; an answer that names the input wrong (no such repo, a gated one) stays an
input error: one line, exit 2. A real runtime process against a real HTTP server standing in for the Hub."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from conftest import stage_config
from recipes.contract import INPUT_ERROR_EXIT

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "recipes" / "samples" / "tiny"
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SLURM_", "HF_"))}, "PYTHONPATH": str(REPO)}


class Hub(http.server.BaseHTTPRequestHandler):
    """Answers every request with one status and the Hub's error code header."""

    status, code = 503, ""

    def do_GET(self) -> None:
        self.send_response(self.status)
        if self.code:
            self.send_header("X-Error-Code", self.code)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error": "stand-in"}')

    do_HEAD = do_GET

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def hub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once it is closed


def prep(tmp_path: Path, env: dict, dataset: str = "hf://org/corpus", tokenizer: str = str(TINY)):
    cfg = {**stage_config("data_prep/pretrain"), "datasets": [{"name": "corpus", "path": dataset}],
           "tokenizer": tokenizer, "output_dir": str(tmp_path / "out"), "hf_cache_dir": str(tmp_path / "cache"),
           "num_shards": 1, "backend": "processes", "workers": 1, "job": {"id": "test"}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return subprocess.run([sys.executable, "-m", "recipes.data_prep_pretrain", "--config", str(path)],
                          env={**ENV, **env}, capture_output=True, text=True, timeout=120)


def one_line(p: subprocess.CompletedProcess) -> str:
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert "Traceback" not in p.stderr and lines, p.stderr
    return lines[-1]


HEAVY = pytest.mark.heavy  # a runtime process each (about a second): the fast tier keeps one of each exit code


@pytest.mark.parametrize("how", ["no network", pytest.param("offline mode", marks=HEAVY),
                                 pytest.param("the Hub's 503", marks=HEAVY)])
def test_the_hub_out_of_reach_is_the_machines_failure(tmp_path, hub, how):
    Hub.status, Hub.code = 503, ""
    env = {"no network": {"HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}"}, "offline mode": {"HF_HUB_OFFLINE": "1"},
           "the Hub's 503": {"HF_ENDPOINT": hub}}[how]
    p = prep(tmp_path, env)
    assert p.returncode == 1, p.stderr
    line = one_line(p)
    assert line.startswith("ultra3 data prep pretrain: error: hf://org/corpus: the Hugging Face Hub cannot be reached "
                           "from this machine (") and "run again, or give a local path" in line, line


@HEAVY
def test_a_hub_tokenizer_out_of_reach_is_the_machines_failure(tmp_path):
    p = prep(tmp_path, {"HF_HUB_OFFLINE": "1"}, str(TINY / "corpus.jsonl.gz"), "org/tokenizer")
    assert p.returncode == 1 and one_line(p).startswith(
        "ultra3 data prep pretrain: error: tokenizer org/tokenizer: the Hugging Face Hub cannot be reached"), p.stderr


@pytest.mark.parametrize("status, code", [(404, "RepoNotFound"), pytest.param(401, "GatedRepo", marks=HEAVY)])
def test_a_hub_answer_about_the_input_stays_an_input_error(tmp_path, hub, status, code):
    Hub.status, Hub.code = status, code
    p = prep(tmp_path, {"HF_ENDPOINT": hub})
    assert p.returncode == INPUT_ERROR_EXIT, p.stderr
    assert one_line(p).startswith("ultra3 data prep pretrain: error: hf://org/corpus: cannot fetch from the Hugging "
                                  "Face Hub ("), p.stderr

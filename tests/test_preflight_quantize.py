"""`ultra3 quantize` needs Python 3.11+ (transformers 5.23 has no release for 3.10): the `quantize` extra says so
in its markers, and the job's preflight on 3.10 says so in one line instead of a hint to install the extra again."""

from __future__ import annotations

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

from packaging.requirements import Requirement

from conftest import REPO
from recipes import preflight


def test_on_python_3_10_the_preflight_says_it_needs_3_11():
    assert preflight.quantize_packages({"backend": "hf"}, (3, 10, 14)) == (
        "the quantize hf backend needs Python 3.11+, this job's is 3.10.14 (the `quantize` extra installs nothing "
        "on it); run the job under Python 3.11+ (the training container has 3.12)")


def test_the_megatron_backend_is_the_training_container_s_whatever_the_python():
    assert preflight.quantize_packages({"backend": "megatron"}, (3, 10, 14)) == \
        preflight.training_packages({"backend": "megatron"})


def test_the_quantize_extra_installs_on_3_11_and_later_only():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for line in extras["quantize"]:
        req = Requirement(line)
        assert req.marker is not None, line
        assert not req.marker.evaluate({"python_version": "3.10", "python_full_version": "3.10.14"}), line
        assert req.marker.evaluate({"python_version": "3.11", "python_full_version": "3.11.7"}), line

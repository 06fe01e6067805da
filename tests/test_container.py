"""`ultra3 container build` without a cluster: the pins (against uv.lock and the NeMo RL record), the digest that
names an image, the build job's dry run and its profile keys, bad input, and which image a stage runs in."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from ultra3 import images, nemo_rl_api
from ultra3.contract import IMAGE_ID
from ultra3.paths import CONFIGS_DIR

REPO = Path(__file__).resolve().parents[1]
KIND_CONFIG = {"training": "default", "rl": "rl", "data": "data"}


def kind_config(kind: str) -> dict:
    """The kind's config, its `defaults` merged (the shared keys, then the file)."""
    merged: dict = {}
    for name in ("_shared/container", f"container/{KIND_CONFIG[kind]}"):
        data = yaml.safe_load((CONFIGS_DIR / f"{name}.yaml").read_text())
        data.pop("defaults", None)
        merged.update(data)
    return merged


def locked_versions() -> dict[str, set[str]]:
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    found: dict[str, set[str]] = {}
    for package in lock["package"]:
        found.setdefault(package["name"], set()).add(package.get("version", ""))
    return found


def requirement(spec: str) -> tuple[str, str]:
    name, version = spec.split("==")
    return re.sub(r"\[.*\]", "", name).lower().replace("_", "-"), version


@pytest.mark.parametrize("kind", ["training", "data"])
def test_pip_pins_are_the_versions_uv_lock_pins(kind):
    locked = locked_versions()
    pins = [requirement(s) for s in kind_config(kind)["args"]["PACKAGES"].split()]
    assert pins
    for name, version in pins:
        assert version in locked.get(name, set()), f"{kind}: {name}=={version}, uv.lock has {locked.get(name)}"


def test_training_image_carries_the_recipe_base_and_megatron_bridge():
    cfg = kind_config("training")
    assert cfg["base"] == "nvcr.io/nvidia/nemo:26.04.01"  # the Ultra recipe's prerequisite
    packages = dict(requirement(s) for s in cfg["args"]["PACKAGES"].split())
    assert packages["megatron-bridge"] == "0.6.2" and packages["megatron-core"].startswith("0.19.")
    text = (CONFIGS_DIR / "container" / cfg["containerfile"]).read_text()
    assert "--constraint /tmp/keep.txt" in text  # the base's torch and Transformer Engine stay
    assert "from megatron.bridge.recipes.nemotronh import nemotron_3_ultra" in text


def test_rl_image_is_nemo_rl_at_the_commit_the_launcher_checks_configs_against():
    args = kind_config("rl")["args"]
    assert args["NEMO_RL_COMMIT"] == nemo_rl_api.commit()
    assert args["NEMO_RL_REPO"] == f"https://github.com/{nemo_rl_api.record()['repository']}.git"


@pytest.mark.parametrize("kind", images.KINDS)
def test_containerfiles_declare_what_they_are_given_and_write_the_identity(kind):
    cfg = kind_config(kind)
    text = (CONFIGS_DIR / "container" / cfg["containerfile"]).read_text()
    assert text.count("FROM ${BASE}") == 1
    assert images.declared_args(text) == {"BASE", "IMAGE_KIND", "IMAGE_DIGEST", *cfg["args"]}
    assert f"> {IMAGE_ID}" in text


def test_the_digest_covers_the_pins_and_nothing_else():
    cfg = {"kind": "data", "base": "b:1", "args": {"PACKAGES": "x==1"}, "platform": "auto", "cache_dir": "/c"}
    one = images.image_of(cfg, "FROM ${BASE}\n", None)
    assert one == images.image_of(dict(cfg), "FROM ${BASE}\n", "h100")  # auto: amd64 for both
    assert one.name == f"ultra3-data-{one.digest[:12]}" and one.path == f"/c/{one.name}.sqsh"
    changed = [images.image_of({**cfg, "base": "b:2"}, "FROM ${BASE}\n", None),
               images.image_of({**cfg, "args": {"PACKAGES": "x==2"}}, "FROM ${BASE}\n", None),
               images.image_of(cfg, "FROM ${BASE}\nRUN true\n", None),
               images.image_of(cfg, "FROM ${BASE}\n", "gb200")]
    assert len({one.digest, *(i.digest for i in changed)}) == 5
    assert changed[3].platform == "linux/arm64"
    same = images.image_of({**cfg, "cache_dir": "/elsewhere", "registry": "r.example.com/t", "force": True},
                           "FROM ${BASE}\n", None)
    assert same.digest == one.digest and same.path == f"/elsewhere/{one.name}.sqsh"


BUILDER = """
[builder]
executor = "slurm"
account = "ultra3"
partition = "batch"
gpu = "b200"
gpus_per_node = 8
container_image = "/images/given.sqsh"
build_partition = "cpu"
build_time = "01:30:00"
build_cache_dir = "{cache}"
build_registry = "registry.example.com/team"
build_gpus_per_node = 1

[plain]
executor = "slurm"
account = "ultra3"
partition = "batch"
gpu = "b200"
gpus_per_node = 8
build_cache_dir = "{cache}"

[mirror]
extends = "plain"
[mirror.images.data]
base = "registry.internal/python:3.12-slim-bookworm"
"""


@pytest.fixture
def profiles(home, tmp_path) -> Path:
    cache = tmp_path / "cache"
    with open("env.toml", "a") as f:
        f.write(BUILDER.format(cache=cache))
    return cache


def section(out: str, title: str) -> str:
    return out.split(f"== {title} ==\n", 1)[1].split("\n== ", 1)[0]


def test_dry_run_of_a_build_shows_its_job_and_exact_script(cli_here, profiles):
    r = cli_here("container", "build", "data", "--batch", "builder", "--dry-run", "--full")
    assert r.rc == 0, r.err
    image = images.kind_image("data", {}, str(profiles), "b200")
    script = section(r.out, "build script")
    assert script.startswith("#!/usr/bin/env bash\n"
                             f"# ultra3 container build data: {image.name} (sha256 {image.digest})")
    assert "--build-arg 'PACKAGES=ray[default]==2.60.0 tokenizers==0.22.2" in script
    assert f"--build-arg IMAGE_DIGEST={image.digest}" in script and "--platform linux/amd64" in script
    assert f"push \"$tag\" docker://registry.example.com/team/ultra3-data:{image.digest[:12]}" in script
    assert "#SBATCH --partition=cpu" in r.out and "#SBATCH --time=01:30:00" in r.out
    assert "--container-image" not in r.out  # builds run on the node itself
    assert re.search(r"^run.partition += cpu  <- profile 'builder' \(env.toml\), its build_\* keys$", r.out,
                     re.M), r.out
    notes = [line for line in r.out.splitlines() if line.startswith("note:")]
    assert any("container_image" in n and "builds run on the node" in n for n in notes), notes
    assert "note: env.toml [builder] build_gpus_per_node: not used: the build job runs podman on the node itself, " \
           "without GPUs" in notes, notes
    assert "produces" not in section(r.out, "inputs and outputs (artifacts)")


def test_a_kind_by_word_or_by_config_and_the_default_is_training(cli_here, profiles):
    word = cli_here("container", "build", "rl", "--batch", "plain", "--dry-run", "--full")
    flag = cli_here("container", "build", "-c", "rl", "--batch", "plain", "--dry-run", "--full")
    assert word.rc == flag.rc == 0 and word.out == flag.out, word.err + flag.err
    assert "# ultra3 container build rl: ultra3-rl-" in word.out and "--platform linux/amd64" in word.out
    default = cli_here("container", "build", "--batch", "plain", "--dry-run", "--full")
    assert default.rc == 0 and "# ultra3 container build training: ultra3-training-" in default.out, default.err
    both = cli_here("container", "build", "rl", "-c", "data", "--batch", "plain", "--dry-run", "--full")
    assert both.rc == 2 and both.err_lines == [both.err_lines[0]] and "rl" in both.err and "-c data" in both.err


@pytest.mark.parametrize("override, key, message", [
    (["args.TYPO=1"], "args.TYPO", "declares no ARG TYPO"),
    (["cache_dir=relative/dir"], "cache_dir", "is relative"),
    (["base=bad image;rm -rf /"], "base", "an image reference"),
    (["platform=linux/riscv64"], "platform", "auto, linux/amd64 or linux/arm64"),
    (["containerfile=missing.Containerfile"], "containerfile", "is not a file"),
    (["args.1BAD=x"], "args.1BAD", "not an environment variable name (set in command line)"),
])
def test_bad_build_input_is_one_line_exit_2(cli_here, profiles, override, key, message):
    r = cli_here("container", "build", "data", "--batch", "plain", "--dry-run", *override)
    assert r.rc == 2, r.out + r.err
    errors = [line for line in r.err_lines if "error" in line]
    assert len(errors) == 1 and key in errors[0] and message in errors[0], r.err
    assert "Traceback" not in r.err


def built(image: images.Image, job: str = "ultra3-container-build_x") -> None:
    """An image in the cache as a build leaves it: the .sqsh, then its manifest."""
    Path(image.cache_dir).mkdir(parents=True, exist_ok=True)
    Path(image.path).write_bytes(b"hsqs")
    Path(image.manifest).write_text(json.dumps({"name": image.name, "kind": image.kind, "digest": image.digest,
                                                "built": "2026-11-26T01:02:11+0000", "job": job}))


def test_a_stage_runs_in_its_kind_once_built_and_says_how_to_build_it_before(cli_here, profiles):
    image = images.kind_image("training", {}, str(profiles), "b200")
    before = cli_here("pretrain", "-c", "tiny", "--batch", "plain", "--dry-run", "--full")
    assert before.rc == 0, before.err
    hint = "ultra3 container build training --batch plain"
    assert any(line.startswith("warning: run.container_image:") and hint in line and image.path in line
               for line in before.out.splitlines()), before.out
    refused = cli_here("pretrain", "-c", "tiny", "--batch", "plain")
    assert refused.rc == 2 and hint in refused.err and "submitted" not in refused.out, refused.out + refused.err

    built(image)
    after = cli_here("pretrain", "-c", "tiny", "--batch", "plain", "--dry-run", "--full")
    assert after.rc == 0, after.err
    shown = section(after.out, "container image")
    assert f"image   {image.path}" in shown and image.digest[:12] in shown and "the stage's kind" in shown, shown
    assert f"--container-image {image.path}" in after.out
    assert re.search(rf"^  image:\n    kind: training\n    name: {image.name}\n", after.out, re.M), after.out


def test_a_profile_names_a_kind_and_its_pins(cli_here, profiles):
    data = images.kind_image("data", {}, str(profiles), "b200")
    built(data)
    r = cli_here("pretrain", "-c", "tiny", "--batch", "plain", "--dry-run", "--full", "run.container_image=data")
    assert r.rc == 0 and f"--container-image {data.path}" in r.out, r.err
    assert "kind    data (run.container_image=data, from command line)" in section(r.out, "container image")
    # the mirror profile pins another base for the data kind: its image is another one, not built
    mirrored = cli_here("data", "prep", "pretrain", "-c", "tiny", "--batch", "mirror", "--dry-run", "--full")
    assert mirrored.rc == 0 and data.path not in mirrored.out, mirrored.err
    build = cli_here("container", "build", "data", "--batch", "mirror", "--dry-run", "--full")
    assert "--build-arg BASE=registry.internal/python:3.12-slim-bookworm" in build.out, build.out + build.err
    name = re.search(r"ultra3-data-[0-9a-f]{12}", section(build.out, "build script")).group(0)
    assert name in mirrored.out and name != data.name


def test_other_stages_note_the_build_keys_they_do_not_read(cli_here, profiles):
    r = cli_here("pretrain", "-c", "tiny", "--batch", "builder", "--dry-run", "--full")
    assert r.rc == 0, r.err
    notes = re.findall(r"^note: env.toml \[builder\] (build_\w+): read by image builds and by stages whose profile "
                       r"names no container_image; not used here$", r.out, re.M)
    assert set(notes) == {"build_partition", "build_time", "build_cache_dir", "build_registry",
                          "build_gpus_per_node"}, r.out[:2000]
    assert "#SBATCH --partition=batch" in r.out and "--container-image /images/given.sqsh" in r.out


def test_preflight_checks_the_image_it_runs_in(tmp_path, monkeypatch):
    from recipes import preflight

    monkeypatch.setattr(preflight, "IMAGE_ID", str(tmp_path / "image.json"))
    want = {"kind": "training", "name": "ultra3-training-0123456789ab", "digest": "0123456789ab" + "0" * 52}
    cfg = {"job": {"image": want}}
    assert preflight.image({"job": {}}) is None  # an image given by path: nothing to compare
    assert "has no" in preflight.image(cfg) and "not an image ultra3 built" in preflight.image(cfg)
    (tmp_path / "image.json").write_text(json.dumps({"kind": "training", "digest": "f" * 64}))
    assert preflight.image(cfg).startswith("image: the container is ultra3-training-ffffffffffff but the job asked "
                                           "for ultra3-training-0123456789ab")
    (tmp_path / "image.json").write_text(json.dumps({"kind": "training", "digest": want["digest"]}))
    assert preflight.image(cfg) is None


def test_preflight_of_a_build_names_the_missing_tools(tmp_path, monkeypatch):
    from recipes import preflight

    monkeypatch.setenv("PATH", str(tmp_path))
    assert preflight.build_tools({}).startswith("podman and mksquashfs not found on this node")

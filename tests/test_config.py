"""Unit tests of the config layers (ultra3.config) and the env.toml profiles (ultra3.profiles)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SAMPLE_ENV_TOML

from ultra3.config import (CLI_SOURCE, Layer, find_config, flatten, load_layers, merge, parse_overrides, parse_value,
                           read_yaml, resolve, unflatten)
from ultra3.dotted import get, put
from ultra3.errors import InvalidConfig, UserError
from ultra3.paths import CONFIGS_DIR
from ultra3.profiles import (ENV_FILE_VAR, SECRET_NAME, find_env_file, load_profile, profile_names, read_env_file)


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No $NEMOTRON_ENV_FILE, and a cwd of our own."""
    monkeypatch.delenv(ENV_FILE_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# -- stage configs: find, defaults, merge ------------------------------------------------------------------

def test_find_config_by_name_and_by_path(tmp_path):
    assert find_config("pretrain", "tiny") == CONFIGS_DIR / "pretrain" / "tiny.yaml"
    mine = write(tmp_path / "mine.yml", "train: {train_iters: 1}\n")
    assert find_config("pretrain", str(mine)) == mine
    with pytest.raises(UserError,
                       match=r"--config: no config 'nope' for this stage; choose one of: default, long_context, smoke, "
                             r"tiny, tiny_phases"):
        find_config("pretrain", "nope")
    with pytest.raises(UserError, match=r"--config: no such file 'missing\.yaml'"):
        find_config("pretrain", "missing.yaml")


def test_defaults_merge_order_of_the_shipped_tiny_config():
    layers = load_layers(find_config("pretrain", "tiny"), "pretrain")
    # the bases first, depth first and in list order, then the file itself
    assert [layer.source for layer in layers] == [
        "configs/_shared/ultra.yaml", "configs/pretrain/default.yaml", "configs/_shared/tiny.yaml",
        "configs/pretrain/tiny.yaml"]
    assert all("defaults" not in layer.values for layer in layers)
    flat, origin = merge(layers)
    assert flat["model.num_layers"] == 7 and origin["model.num_layers"] == "configs/_shared/tiny.yaml"
    assert flat["model.seq_length"] == 512
    assert flat["optimizer.lr"] == 2.5e-4 and origin["optimizer.lr"] == "configs/pretrain/default.yaml"
    assert flat["model.num_moe_experts"] == 16
    assert origin["model.mtp_loss_scaling_factor"] == "configs/_shared/ultra.yaml"
    assert origin["scheduler.lr_decay_iters"] == "configs/pretrain/tiny.yaml"


def test_defaults_later_base_wins_and_the_file_wins_over_its_bases(tmp_path):
    write(tmp_path / "a.yaml", "x: {v: a, only_a: 1}\n")
    write(tmp_path / "b.yaml", "x: {v: b}\n")
    child = write(tmp_path / "child.yaml", "defaults: [a, b.yaml]\ny: 1\n")
    flat, origin = merge(load_layers(child, "pretrain"))
    assert flat == {"x.v": "b", "x.only_a": 1, "y": 1}
    assert origin["x.v"].endswith("b.yaml") and origin["x.only_a"].endswith("a.yaml")
    child.write_text("defaults: [a, b]\nx: {v: child}\n")
    assert merge(load_layers(child, "pretrain"))[0]["x.v"] == "child"


def test_defaults_as_a_single_name_and_stage_dir_fallback(tmp_path):
    # a name not next to the file is looked up in the stage's config dir
    child = write(tmp_path / "child.yaml", "defaults: tiny\nlogger: {log_interval: 3}\n")
    layers = load_layers(child, "sft")
    assert layers[-2].source == "configs/sft/tiny.yaml"
    assert layers[-1].source == str(child.resolve())
    flat, _ = merge(layers)
    assert flat["logger.log_interval"] == 3 and flat["dataset.pack_size"] == 512
    # a file next to the child shadows the stage's config of the same name
    write(tmp_path / "tiny.yaml", "mine: true\n")
    assert [layer.values for layer in load_layers(child, "sft")][0] == {"mine": True}


def test_defaults_errors_name_the_file(tmp_path):
    loop = write(tmp_path / "a.yaml", "defaults: [b]\n")
    write(tmp_path / "b.yaml", "defaults: [a]\n")
    with pytest.raises(UserError, match=r"a\.yaml: circular defaults: .*a\.yaml -> .*b\.yaml -> .*a\.yaml$"):
        load_layers(loop, "pretrain")
    orphan = write(tmp_path / "orphan.yaml", "defaults: [nosuch]\n")
    with pytest.raises(UserError, match=r"orphan\.yaml: defaults names 'nosuch'"):
        load_layers(orphan, "pretrain")
    bad = write(tmp_path / "bad.yaml", "defaults: [1, 2]\n")
    with pytest.raises(UserError, match=r"bad\.yaml: defaults must be a config name or a list of names"):
        load_layers(bad, "pretrain")


def test_read_yaml(tmp_path):
    assert read_yaml(write(tmp_path / "empty.yaml", "# nothing\n")) == {}
    with pytest.raises(UserError, match=r"list\.yaml: must be a mapping of keys, got list$"):
        read_yaml(write(tmp_path / "list.yaml", "- 1\n"))
    with pytest.raises(UserError, match=r"tab\.yaml:2: invalid YAML: "):
        read_yaml(write(tmp_path / "tab.yaml", "a:\n\tb: 1\n"))
    typed = read_yaml(write(tmp_path / "typed.yaml", "lr: 1e-4\ntime: 4:00:00\nday: 2024-01-01\nn: 12\n"))
    assert typed == {"lr": 1e-4, "time": "4:00:00", "day": "2024-01-01", "n": 12}


def test_merge_provenance_later_layer_wins():
    flat, origin = merge([Layer("base", {"a.b": 1, "a.c": 2}), Layer("profile", {"a.b": 3}),
                          Layer(CLI_SOURCE, {"a.d": 4})])
    assert flat == {"a.b": 3, "a.c": 2, "a.d": 4}
    assert origin == {"a.b": "profile", "a.c": "base", "a.d": CLI_SOURCE}


def test_merge_a_leaf_replaces_a_table_and_a_table_replaces_a_leaf():
    flat, origin = merge([Layer("base", {"t.x": 1, "t.y": 2, "leaf": 5}), Layer("cli", {"t": None, "leaf.sub": 6})])
    assert flat == {"t": None, "leaf.sub": 6}
    assert origin == {"t": "cli", "leaf.sub": "cli"}
    # the other way round, and nothing of the replaced table survives in the tree
    flat, origin = merge([Layer("base", {"t": 1}), Layer("cli", {"t.x": 2})])
    assert unflatten(flat) == {"t": {"x": 2}} and origin == {"t.x": "cli"}


def test_flatten_unflatten_round_trip():
    tree = {"a": {"b": 1, "c": {"d": [1, 2]}}, "e": {}, "f": None}
    flat = flatten(tree)
    assert flat == {"a.b": 1, "a.c.d": [1, 2], "e": {}, "f": None}
    assert unflatten(flat) == tree
    assert flatten({"x": 1}, "run.") == {"run.x": 1}


def test_dotted_get_and_put():
    tree = {"a": {"b": 0, "n": None, "l": [{"x": 1}], "s": "text"}, "off": False}
    assert get(tree, "a.b") == 0 and get(tree, "off") is False and get(tree, "a") is tree["a"]
    assert get(tree, "a.l") == [{"x": 1}] and get(tree, "a.l.0") is None  # no list indices
    for missing in ("a.zz", "zz.b", "a.n", "a.n.x", "a.s.x", "a.b.x"):  # missing, None, or under a value
        assert get(tree, missing) is None and get(tree, missing, 7) == 7
    assert get(None, "a") is None and get(tree, "a.b", 7) == 0
    put(tree, "a.b", 1)
    put(tree, "a.s.x", 2)  # a value on the way becomes a table
    put(tree, "new.deep.key", 3)
    assert tree["a"]["b"] == 1 and tree["a"]["s"] == {"x": 2} and tree["new"] == {"deep": {"key": 3}}


def test_resolve_interpolations_and_a_dangling_one():
    assert resolve({"a": {"b": 2}, "c": "${a.b}", "d": "x/${a.b}"}, {}) == {"a": {"b": 2}, "c": 2, "d": "x/2"}
    with pytest.raises(UserError, match=r"^c: cannot resolve the interpolation"):
        resolve({"c": "${nope}"}, {})


@pytest.mark.parametrize("tree", [
    {"x": {"a": 1, "b": "${.a}", "c": {"d": "${..a}"}}},  # relative
    {"x": [1, [2, 3]], "y": "${x.1}", "z": "${x[1][0]}"},  # list indices
    {"k": "a", "x": {"a": [1]}, "y": "${x.${k}}", "z": "${x[${k}]}"},  # a key held by another
    {"a": {"b": {"c": 1}}, "r": "${a}", "s": "${r.b.c}", "t": "${r.b}"},  # through a reference
    {"x": {"a": 1, "b": 2}, "s": "${oc.select:x.a,0}", "t": "${oc.select:nope,'d'}", "u": "${oc.dict.values:x}",
     "v": "${oc.dict.keys:x}", "w": "${oc.env:HOME}", "q": "${oc.env:ULTRA3_NOT_SET,'${x.a}'}"},
    {"e": "\\${x}", "x": {"y": "${..z}"}, "z": "z"},  # escaped: text
], ids=["relative", "list-index", "dynamic-key", "through", "resolvers", "escaped"])
def test_resolve_gives_what_omegaconf_gives(tree):
    from omegaconf import OmegaConf

    assert resolve(tree, {}) == OmegaConf.to_container(OmegaConf.create(tree), resolve=True)


def doubling(levels: int, template: str) -> dict:
    return {"x": {"k0": "0123456789", **{f"k{i}": template.format(f"x.k{i - 1}") for i in range(1, levels)}}}


def deep(levels: int, leaf: str) -> dict:
    return {"a": deep(levels - 1, leaf)} if levels else {"a": leaf}


@pytest.mark.parametrize("tree,error", [
    (doubling(30, "${{oc.select:{0},${{{0}}}}}"), r"x\.k\d+: interpolations \(\$\{oc\.select:x\.k\d+,.*\) repeat "
                                                   r"more than 10,000 values \(set in a\.yaml\); write the values out"),
    (doubling(30, "${{{0}}}-${{{0}}}"), r"x\.k\d+: interpolations \(\$\{x\.k\d+\}-\$\{x\.k\d+\}\) repeat more than "
                                        r"1,000,000 characters \(set in a\.yaml\)"),
    (doubling(3, "${{oc.env:ULTRA3_BIG}}${{oc.env:ULTRA3_BIG}}"), r"x\.k1: .* repeat more than 1,000,000 characters"),
    ({"x": {"a": "${oc.create:'{b: 1}'}"}}, r"x\.a: oc\.create reads text as a value while it resolves, which can "
                                            r"repeat values without bound \(set in a\.yaml\); write the value out$"),
    ({"x": {"k": "${j}", "a": "${oc.select:${x.k}}"}, "j": "x"},
     r"x\.a: the key in \$\{oc\.select:\$\{x\.k\}\} is known only once resolved \(set in a\.yaml\); name the key"),
    ({"x": {"a": "${${x.n}:HOME}", "n": "oc.env"}}, r"x\.a: the resolver's name in .* is interpolated"),
    ({"x": {f"k{i}": f"${{x.k{i + 1}}}" for i in range(40)}}, r"x\.k\d+: interpolations nested more than 32 deep, "
                                                              r"each inside or naming the next \(set in a\.yaml\); "
                                                              r"name the value itself$"),
    ({"x": {f"k{i}": deep(30, f"${{x.k{i + 1}}}") for i in range(30)}},
     r"x\.k\d+(\.a)+: nested more than 32 levels deep once its interpolations are resolved \(set in a\.yaml\); a "
     r"config is a few levels of tables$"),
    ({"x": {"a": "${x.b}", "b": "${x.a}"}}, r"x\.a: cannot resolve the interpolation: Recursive"),  # OmegaConf's
], ids=["oc-select-doubling", "string-doubling", "oc-env-length", "oc-create", "key-from-a-reference", "resolver-name",
        "chain-40", "tables-through-references", "loop"])
def test_resolve_refuses_what_would_not_end(tree, error, monkeypatch):
    monkeypatch.setenv("ULTRA3_BIG", "b" * 600_000)
    with pytest.raises(UserError, match="^" + error):
        resolve(tree, {"x": "a.yaml"})


# -- overrides ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw,value", [
    ("12", 12), ("-3", -3), ("1e-4", 1e-4), ("2.5e-6", 2.5e-6), ("1e5", 1e5), ("0.5", 0.5), (".5", 0.5),
    ("true", True), ("false", False), ("null", None), ("~", None), ("", ""), ("abc", "abc"), ("'12'", "12"),
    ("[a, b]", ["a", "b"]), ("[1, 2.5]", [1, 2.5]), ("[]", []), ("{a: 1}", {"a": 1}),
    ("01:00:00", "01:00:00"), ("4:00:00", "4:00:00"), ("2024-01-01", "2024-01-01"),
    ("/lustre/x.json", "/lustre/x.json"),
])
def test_override_value_typing(raw, value):
    got = parse_value(raw)
    assert got == value and type(got) is type(value)


def test_parse_overrides():
    layer = parse_overrides(["train.train_iters=20", "optimizer.lr=1e-4", "model.recompute_modules=[moe, core_attn]",
                             "recipe.hf_model=null", "run.env={A: x, B: 2}", "logger.wandb_project=", "a.b=c=d"])
    assert layer.source == CLI_SOURCE
    assert layer.values == {"train.train_iters": 20, "optimizer.lr": 1e-4,
                            "model.recompute_modules": ["moe", "core_attn"], "recipe.hf_model": None,
                            "run.env.A": "x", "run.env.B": 2, "logger.wandb_project": "", "a.b": "c=d"}
    assert parse_overrides(["x=1", "x=2"]).values == {"x": 2}  # the last one wins


@pytest.mark.parametrize("token,message", [
    ("notakv", r"'notakv': not an option or a key=value override"),
    ("1abc=2", r"'1abc=2': '1abc' is not a dotted config key"),
    ("a..b=2", r"'a\.\.b=2': 'a\.\.b' is not a dotted config key"),
    ("=2", r"'=2': '' is not a dotted config key"),
    ("a.b=[1", r"'a\.b=\[1': cannot parse the value '\[1'"),
])
def test_parse_overrides_errors(token, message):
    with pytest.raises(UserError, match=message):
        parse_overrides([token])


# -- env.toml discovery ---------------------------------------------------------------------------------

def test_env_file_discovery_order(clean_env, monkeypatch):
    root = clean_env
    walked = write(root / "env.toml", "[walked]\nexecutor = 'local'\n")
    deep = root / "project" / "sub" / "deeper"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    assert find_env_file() == walked  # the first env.toml walking up from the cwd

    nearer = write(root / "project" / "env.toml", "[nearer]\nexecutor = 'local'\n")
    assert find_env_file() == nearer  # the nearest one wins

    from_var = write(root / "var.toml", "[var]\nexecutor = 'local'\n")
    monkeypatch.setenv(ENV_FILE_VAR, str(from_var))
    assert find_env_file() == from_var  # $NEMOTRON_ENV_FILE beats walking up

    explicit = write(root / "explicit.toml", "[explicit]\nexecutor = 'local'\n")
    assert find_env_file(str(explicit)) == explicit  # --env-file beats $NEMOTRON_ENV_FILE
    assert load_profile("explicit", str(explicit)).file == explicit
    assert load_profile("var").file == from_var

    monkeypatch.delenv(ENV_FILE_VAR)
    assert load_profile("nearer").file == nearer
    assert profile_names() == (nearer, ["nearer"])


def test_env_file_missing_is_an_error_not_a_fallback(clean_env, monkeypatch):
    write(clean_env / "env.toml", SAMPLE_ENV_TOML)
    with pytest.raises(UserError, match=r"^--env-file: no such file 'gone\.toml'$"):
        find_env_file("gone.toml")
    monkeypatch.setenv(ENV_FILE_VAR, str(clean_env / "gone.toml"))
    with pytest.raises(UserError, match=rf"^{ENV_FILE_VAR}: no such file '.*gone\.toml'$"):
        find_env_file()
    assert profile_names() == (None, [])  # --help never raises


def test_no_env_file_found(clean_env):
    assert find_env_file() is None
    assert profile_names() == (None, [])
    with pytest.raises(UserError, match=r"^--batch ci: no env\.toml found"):
        load_profile("ci", flag="--batch")


def test_read_env_file_errors(tmp_path):
    with pytest.raises(UserError, match=r"bad\.toml: invalid TOML: "):
        read_env_file(write(tmp_path / "bad.toml", "[a\n"))
    with pytest.raises(UserError, match=r"top\.toml: top-level key 'x' must be a \[profile\] table$"):
        read_env_file(write(tmp_path / "top.toml", "x = 1\n[a]\nexecutor = 'local'\n"))


# -- profiles -------------------------------------------------------------------------------------------

def test_sample_profiles(clean_env):
    path = write(clean_env / "env.toml", SAMPLE_ENV_TOML)
    ci = load_profile("ci")
    assert (ci.name, ci.executor, ci.file) == ("ci", "slurm", path)
    assert ci.values == {"account": "ultra3", "partition": "debug", "gpu": "h100", "gpus_per_node": 1,
                         "time": "00:05:00", "container_image": ""}
    assert ci.source == "profile 'ci' (env.toml)"
    ci_cpu = load_profile("ci-cpu")  # extends ci, overrides one key
    assert ci_cpu.executor == "slurm"
    assert ci_cpu.values == {**ci.values, "gpus_per_node": 0}
    assert "extends" not in ci_cpu.values and "executor" not in ci_cpu.values
    assert load_profile("workstation").executor == "local"


def test_extends_merges_env_tables_and_replaces_the_rest(tmp_path):
    env = write(tmp_path / "env.toml", """
[base]
executor = "slurm"
account = "a"
mounts = ["/lustre:/lustre", "/home:/home"]
setup = ["module load cuda"]
[base.env]
NCCL_DEBUG = "WARN"
KEEP = "1"

[mid]
extends = "base"
partition = "batch"
[mid.env]
NCCL_DEBUG = "INFO"

[leaf]
extends = "mid"
mounts = ["/scratch:/scratch"]
[leaf.env]
EXTRA = "x"
""")
    leaf = load_profile("leaf", str(env))
    assert leaf.values["env"] == {"NCCL_DEBUG": "INFO", "KEEP": "1", "EXTRA": "x"}
    assert leaf.values["mounts"] == ["/scratch:/scratch"]  # lists are replaced, not appended
    assert leaf.values["setup"] == ["module load cuda"]
    assert leaf.values["partition"] == "batch" and leaf.executor == "slurm"
    assert load_profile("base", str(env)).values["env"] == {"NCCL_DEBUG": "WARN", "KEEP": "1"}  # untouched


@pytest.mark.parametrize("toml,name,message", [
    ("[a]\nextends = 'b'\n[b]\nextends = 'a'\n", "a", r"circular extends: a -> b -> a$"),
    ("[a]\nextends = 'nope'\n", "a", r"^\[a\] extends 'nope': no such profile in .*env\.toml \(profiles: a\)"),
    ("[a]\nextends = ['b']\n[b]\nexecutor = 'local'\n", "a", r"\[a\]: extends must be a profile name, got \['b'\]$"),
    ("[a]\naccount = 'x'\n", "a", r"\[a\]: executor is none; set executor"),
    ("[a]\nexecutor = 'kubernetes'\n", "a", r"\[a\]: executor is 'kubernetes'"),
    ("[hopper]\nexecutor = 'local'\n", "hoper", r"^--run 'hoper': no such profile .*; did you mean 'hopper'\?$"),
])
def test_profile_user_errors(tmp_path, toml, name, message):
    env = write(tmp_path / "env.toml", toml)
    with pytest.raises(UserError, match=message):
        load_profile(name, str(env))


@pytest.mark.parametrize("toml,lines", [
    ("[a]\nexecutor = 'slurm'\naccount = 'x'\nparttion = 'p'\n", ["error: env.toml [a] parttion: unknown key; did you "
                                                                  "mean 'partition'?"]),
    ("[a]\nexecutor = 'local'\naccount = 'x'\ntime = '01:00:00'\n",
     ["error: env.toml [a] account: is only used by the slurm executor, not local; remove it or pick a profile with "
      "--run/--batch",
      "error: env.toml [a] time: is only used by the slurm executor, not local; remove it or pick a profile with "
      "--run/--batch"]),
    ("[a]\nexecutor = 'slurm'\nexclusive = 'yes'\ngpus_per_node = 'eight'\n",
     ["error: env.toml [a] exclusive: must be true/false, got 'yes'",
      "error: env.toml [a] gpus_per_node: must be an integer >= 0, got 'eight'"]),
    ("[a]\nexecutor = 'slurm'\n[a.env]\nHF_TOKEN = 'x'\nMY_PASSWORD = 'y'\n",
     ["error: env.toml [a] env.HF_TOKEN: secrets don't belong in env.toml: export HF_TOKEN where you submit from "
      "(for SSH profiles: in the login node's environment); the job inherits it from the environment",
      "error: env.toml [a] env.MY_PASSWORD: secrets don't belong in env.toml: export MY_PASSWORD where you submit "
      "from (for SSH profiles: in the login node's environment); the job inherits it from the environment"]),
])
def test_profile_schema_errors_one_line_each(tmp_path, toml, lines):
    """Kept on the profile, its bad keys left out, for the stage's check to report with its own errors."""
    env = write(tmp_path / "env.toml", toml)
    profile = load_profile("a", str(env))
    assert InvalidConfig(profile.errors).lines() == lines
    assert not {line.split()[3].rstrip(":") for line in lines} & set(flatten(profile.values))


def test_profile_and_config_errors_come_in_one_round(cli_here, tmp_path):
    env = write(tmp_path / "env.toml", "[a]\nexecutor = 'slurm'\naccount = 'x'\nparttion = 'p'\ngpus_per_node = 1\n")
    r = cli_here("pretrain", "-c", "tiny", "--batch", "a", "--env-file", str(env), "--dry-run",
                 "train.global_batch_size=3", "train.micro_batch_size=2", "model.num_layrs=4")
    assert r.rc == 2 and r.out == ""
    assert r.err_lines[0] == "error: env.toml [a] parttion: unknown key; did you mean 'partition'?", r.err
    assert any(line.startswith("error: model.num_layrs: unknown key") for line in r.err_lines), r.err
    assert any(line.startswith("error: train.global_batch_size: global batch 3 is not divisible") for line in
               r.err_lines), r.err


def test_secret_names():
    for name in ("HF_TOKEN", "hf_token", "GITHUB_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD",
                 "GOOGLE_APPLICATION_CREDENTIALS", "NGC_API_KEY"):
        assert SECRET_NAME.search(name), name
    for name in ("tokenizer", "TOKENIZERS_PARALLELISM", "NCCL_DEBUG", "HF_HOME", "output_dir",
                 "model.moe_token_dispatcher_type", "model.moe_router_load_balancing_type"):
        assert not SECRET_NAME.search(name), name


def test_tokenizers_parallelism_is_not_a_secret(tmp_path):
    env = write(tmp_path / "env.toml", "[a]\nexecutor = 'local'\n[a.env]\nTOKENIZERS_PARALLELISM = 'false'\n")
    assert load_profile("a", str(env)).values["env"] == {"TOKENIZERS_PARALLELISM": "false"}

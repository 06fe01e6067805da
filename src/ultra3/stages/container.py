"""`ultra3 container build`: an image kind (training, rl, data) built with podman into an enroot .sqsh named by
its digest, on a node itself (no image around the job)."""

from __future__ import annotations

from ..stage import Parts, Stage


def parts() -> Parts:
    from ..cost import image_build
    from ..images import built_already, settle
    from ..schema import CONTAINER
    from ..validation.container import validate_container

    return Parts(CONTAINER, validate_container, image_build, settle=settle, done=built_already)


BUILD = Stage(
    ("container", "build"), "Build an image kind (training, rl, data) with podman into an enroot .sqsh named "
    "by its digest.", "container", "container_build", "process", ("python_version", "build_tools"), parts,
    image=None, named_configs=True,
    configs_note="default: the training image (pretrain, sft, quantize), built when no kind is named",
    profile_keys=(("build_partition", "run.partition"), ("build_time", "run.time"),
                  ("build_cache_dir", "cache_dir"), ("build_registry", "registry")),
    examples=("ultra3 container build training --batch mycluster --dry-run",
              "ultra3 container build data --batch mycluster",
              "ultra3 container build rl --run gb200 force=true"),
)

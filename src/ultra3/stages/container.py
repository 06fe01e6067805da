"""`ultra3 container build`: an image kind (training, rl, data) built with podman into an enroot .sqsh named by
its digest, on a node itself (no image around the job)."""

from __future__ import annotations

from ..stage import Stage


class ContainerBuild(Stage):
    def schema(self) -> dict:
        from ..schema import CONTAINER

        return CONTAINER

    def validate(self, cfg, report) -> None:
        from ..validation.container import validate_container

        validate_container(cfg, report)

    def cost(self, config, measured):
        from ..cost import image_build

        return image_build(config, measured)

    def settle(self, job) -> None:
        from ..images import settle

        settle(job)

    def done(self, job) -> str | None:
        from ..images import built_already

        return built_already(job)


BUILD = ContainerBuild(
    ("container", "build"), "Build an image kind (training, rl, data) with podman into an enroot .sqsh named "
    "by its digest.", "container", "container_build", "process", ("python_version", "build_tools"),
    image=None, named_configs=True,
    profile_keys=(("build_partition", "run.partition"), ("build_time", "run.time"),
                  ("build_cache_dir", "cache_dir"), ("build_registry", "registry")),
    examples=("ultra3 container build training --batch mycluster --dry-run",
              "ultra3 container build data --batch mycluster",
              "ultra3 container build rl --run gb200 force=true"),
)

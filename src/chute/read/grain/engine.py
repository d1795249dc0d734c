"""The Grain engine behind ``chute.load(..., engine="grain")``: its plan
(:mod:`.plan`) and its dataset (:mod:`.dataset`) over the record indexes (:mod:`.source`)."""

from __future__ import annotations

from typing import Any

from chute.errors import ChuteError
from chute.format.manifest import Manifest
from chute.read import cache as shard_cache
from chute.read.augment import DeviceAugmentation
from chute.read.engine import LoadInfo, make_info
from chute.read.grain.dataset import make_dataset
from chute.read.grain.mixed import make_mixed_dataset
from chute.read.grain.plan import GrainPlan, make_plan
from chute.read.grain.source import GrainSource
from chute.read.mixture import Mixture
from chute.read.options import LoadOptions
from chute.read.share import Share


class GrainEngine:
    """The Grain engine (see :class:`chute.read.engine.Engine`)."""

    def plan(
        self,
        manifest: Manifest,
        split: str,
        options: LoadOptions,
        *,
        input_context: Any = None,
        strategy: Any = None,
    ) -> GrainPlan:
        """The plan of this input pipeline: a JAX process's (``input_context``), or the
        whole split in global batches for a ``tf.distribute`` strategy of one host."""
        share, replicas = _share(input_context, strategy)
        return make_plan(manifest, split, options, share, replicas)

    def mixed(
        self,
        mixture: Mixture,
        split: str,
        options: LoadOptions,
        *,
        input_context: Any = None,
        strategy: Any = None,
    ) -> tuple[Any, LoadInfo]:
        """A mixture's Grain dataset for this input pipeline, and its LoadInfo."""
        share, replicas = _share(input_context, strategy)
        dataset, plan, mix = make_mixed_dataset(mixture, split, options, share, replicas)
        info = make_info(
            mixture.first,
            options,
            num_examples=plan.num_examples,
            steps=len(dataset),
            global_batch_size=plan.batch_size * share.pipelines,
            training=True,
            device_augmentation=DeviceAugmentation(plan.heavy, plan.seed) if plan.heavy else None,
            mixture=mix,
        )
        return dataset, info

    def build(
        self, plan: GrainPlan, manifest: Manifest, options: LoadOptions
    ) -> tuple[Any, LoadInfo]:
        """The Grain dataset of ``plan`` and its LoadInfo."""
        # A bucket's shards are read from verified local copies (None: local, or cache_dir="none")
        cache = shard_cache.for_load(manifest.location, options)
        dataset = make_dataset(plan, GrainSource(manifest, plan.split, cache), manifest)
        info = make_info(
            manifest,
            options,
            num_examples=plan.num_examples,
            steps=len(dataset),
            global_batch_size=plan.batch_size * plan.share.pipelines,
            training=plan.training,
            device_augmentation=DeviceAugmentation(plan.heavy, plan.seed) if plan.heavy else None,
        )
        return dataset, info


def _share(input_context: Any, strategy: Any) -> tuple[Share, int]:
    """This input pipeline's share, and the replicas of one host its batches feed."""
    replicas = 1
    if strategy is not None:
        if _strategy_hosts(strategy) > 1:
            raise ChuteError(
                "engine='grain' under a tf.distribute strategy on several hosts is not "
                "supported: use engine='tf', or JAX processes (each reads its share)"
            )
        replicas = strategy.num_replicas_in_sync
    share = Share()
    if input_context is not None:  # Grain reads only which pipeline of how many
        share = Share(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return share, replicas


def _strategy_hosts(strategy) -> int:
    """Hosts a tf.distribute strategy spans (1 for the strategies of one machine)."""
    # Every tf.distribute.Strategy has the property; it is None on one machine.
    resolver = strategy.cluster_resolver
    if resolver is None:
        return 1
    spec = resolver.cluster_spec().as_dict()
    return max(1, sum(len(tasks) for name, tasks in spec.items() if name in ("worker", "chief")))

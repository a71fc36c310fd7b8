"""A made-up engine, registered from this one module: an engine is one entry.

Importing it registers `dummy` before the flags are defined, as a module
of a new engine would: one `registry.register(Engine(...))`, every fact a
field. Its distributor is the default one (it trains on one device); it
sends one all-reduce per step between nodes, carried at half NCCL's
bandwidth, so the scaling model projects it and the bench gives it a row.
`tests/test_dummy_engine.py` runs it through `resnet_main.py --dry_run`,
`python -m tf_resnet.scaling` and the bench's rows with no other file
touched; `docs/architecture.md` ("Where to add") names these two files.
"""

from tf_resnet import traffic
from tf_resnet.engines import registry

DUMMY = registry.register(
    registry.Engine(
        "dummy",
        "a made-up engine: the default distributor under its own name",
        registry.Call(
            "tf_resnet.distribute.tf_strategy", "make_default_distributor"
        ),
        traffic=traffic.ALL_REDUCE_EVERY_STEP,
        transport=registry.Transport(
            "dummy", "horovod", 0.5, "made up: half NCCL's bandwidth"
        ),
    )
)

"""The engine wing: what a distribution engine is, in one package.

`registry` holds one `Engine` record per `--distribution` value, every
fact of each (its distributor, launcher, device rule, traffic and
transport); `devices` the device rules and the plan they give a process;
`startup` turns `--distribution` into the record a process runs, once;
`distributors` makes the distributor of that record. `tf_resnet.config`
reads the registry's names for its flag and checks; nothing outside this
package tests an engine's name (`tests/test_engine_facts.py`).
"""

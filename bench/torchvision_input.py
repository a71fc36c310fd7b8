"""torchvision's ImageFolder + DataLoader: the reference input pipeline.

A worker of `bench/input_pipeline.py`, started with the Python of an
environment that has torchvision (bench/requirements-torchvision.txt):
the training transform equal to ours (random crop of the image padded by
the dataset's pad, horizontal flip, the dataset's mean/std), shuffled
batches, `num_workers` decoding processes. Imports no TensorFlow.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402


def setup(spec):
    """Times blocks of `spec['batches']` batches of a DataLoader."""
    import torch
    from torchvision import datasets, transforms

    torch.set_num_threads(1)  # Decoding happens in the workers.
    start = time.perf_counter()
    transform = transforms.Compose(
        [
            transforms.RandomCrop(spec["size"], padding=spec["pad"]),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(spec["mean"], spec["std"]),
        ]
    )
    folder = datasets.ImageFolder(
        os.path.join(spec["root"], "train"), transform=transform
    )
    loader = torch.utils.data.DataLoader(
        folder,
        batch_size=spec["batch"],
        shuffle=True,
        drop_last=True,
        num_workers=spec["workers"],
        persistent_workers=True,
        generator=torch.Generator().manual_seed(0),
    )
    state = {"iterator": iter(loader)}

    def next_batch():
        try:
            return next(state["iterator"])
        except StopIteration:  # A new epoch, on the same workers.
            state["iterator"] = iter(loader)
            return next(state["iterator"])

    next_batch()
    info = {"first_batch_s": time.perf_counter() - start}
    batches = int(spec["batches"])

    def run_block():
        for _ in range(batches):
            next_batch()
        return batches * int(spec["batch"])

    run_block()  # Lets the workers' queues fill, as ours is warmed up.
    return run_block, info


if __name__ == "__main__":
    common.serve(lambda: setup(common.worker_spec(sys.argv)))

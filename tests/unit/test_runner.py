import gc
import itertools

from services.common.runner import freeze_startup_heap


class Node:
    def __init__(self) -> None:
        self.peer: Node | None = None


def test_the_startup_heap_is_frozen_so_full_collections_skip_it():
    gc.unfreeze()
    try:
        heap = [Node() for _ in range(200_000)]  # a big start-up heap, cycles included
        for a, b in itertools.pairwise(heap):
            a.peer, b.peer = b, a
        gc.collect()
        unfrozen_gen2 = len(gc.get_objects(generation=2))
        frozen = freeze_startup_heap()
        assert frozen >= len(heap)
        # The objects left to the collector are what came after start-up, not the heap.
        assert len(gc.get_objects(generation=2)) < unfrozen_gen2 - len(heap)
        assert all(gc.is_tracked(n) for n in heap[:3]) and heap[1].peer is heap[2]
    finally:
        gc.unfreeze()

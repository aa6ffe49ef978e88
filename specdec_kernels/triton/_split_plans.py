"""How the split-V Triton kernels cut a vocabulary row into chunks (host side).

Two plans, for two kinds of kernels (the CUDA twins are in csrc/launch_plan.h):
- `stats_plan`: kernels that reduce every row they read to per-chunk statistics (argmax,
  rank counts, softmax sums) and merge them afterwards. The chunks depend on V only, so a
  row's merge reads the same number of partials whatever the batch.
- `sampling_plan`: kernels whose last program per row rescans one chunk to find the drawn
  id (rejection sampling, block verification, tree sampling). The chunk count follows the
  rows, so a small batch still fills the GPU, and a chunk stays small enough
  (max_tiles tiles) that the rescan is cheap at large B.
Both return (BLOCK_V, tiles per chunk, number of chunks); every chunk owns at least one tile.
"""

import triton

BLOCK_V = 1024  # vocabulary elements per tile (power of two), both plans

# stats_plan
STATS_TILES = 4  # tiles one program streams before V is split further
STATS_MAX_SPLITS = 64  # cap on programs per row; a larger V gives each program more tiles

# sampling_plan
MIN_TILES = 2  # smallest chunk: each program also redoes its row's cheap scalar work
MAX_TILES = 8  # largest chunk: bounds the last program's rescan at large B
TARGET_PROGRAMS = 4 * 132  # programs per launch worth aiming for at small B (~4 per SM of an H100)


def tile_width(vocab: int, block_v: int = BLOCK_V) -> int:
    """BLOCK_V for a row of `vocab`: block_v, or the next power of two of a smaller V (>= 16)."""
    return min(block_v, max(16, triton.next_power_of_2(vocab)))


def stats_plan(vocab: int, block_v: int = BLOCK_V, tiles_per_program: int = STATS_TILES,
               max_splits: int = STATS_MAX_SPLITS) -> tuple[int, int, int]:
    """(BLOCK_V, TILES, num_splits) of a statistics kernel: each of num_splits programs per row
    streams TILES tiles (a power of two: few distinct constexpr values)."""
    block_v = tile_width(vocab, block_v)
    num_tiles = triton.cdiv(vocab, block_v)
    wanted = max(tiles_per_program, triton.cdiv(num_tiles, max_splits))
    tiles = min(num_tiles, triton.next_power_of_2(wanted))
    return block_v, tiles, triton.cdiv(num_tiles, tiles)


def sampling_plan(rows: int, vocab: int, block_v: int = BLOCK_V, min_tiles: int = MIN_TILES,
                  max_tiles: int = MAX_TILES, target_programs: int = TARGET_PROGRAMS) -> tuple[int, int, int]:
    """(BLOCK_V, tiles per chunk, num_splits) of a sampling kernel over `rows` rows: about
    target_programs programs in all, each chunk min_tiles..max_tiles tiles (fewer when V is small)."""
    block_v = tile_width(vocab, block_v)
    num_tiles = triton.cdiv(vocab, block_v)
    splits = min(triton.cdiv(target_programs, rows), max(1, num_tiles // min_tiles))
    splits = max(splits, triton.cdiv(num_tiles, max_tiles))
    tiles = triton.cdiv(num_tiles, splits)
    return block_v, tiles, triton.cdiv(num_tiles, tiles)


def most_sampling_splits(vocab: int, block_v: int = BLOCK_V, min_tiles: int = MIN_TILES,
                         max_tiles: int = MAX_TILES, target_programs: int = TARGET_PROGRAMS) -> int:
    """The most chunks `sampling_plan` gives a row of `vocab` (at one row): a kernel sizes its
    BLOCK_S for this, so the merge's lanes never follow B."""
    return sampling_plan(1, vocab, block_v, min_tiles, max_tiles, target_programs)[2]

// The grouped MMQ's tile table (`mmq_id.cu`), after moe.cu in one program: from the
// routed experts `ids` (one a (token, slot) pair), each expert's rows of the sorted
// order (`moe_sort`: pairs by expert, experts ascending, so expert e's rows start at the
// count of pairs routed to experts below it) cut into tiles of up to `tile` rows:
// [expert, first row, rows] per tile, experts ascending, every slot past the last tile
// zeroed (`max_tiles` slots). One block of MOE_TILES_THREADS threads, thread e the
// expert e (`experts` <= MOE_TILES_THREADS): counts by shared atomics, then block-wide
// prefix sums of the rows and of the tiles (a warp scan, then the warps' totals).

#define MOE_TILES_THREADS 512

extern "C" __global__ void __launch_bounds__(MOE_TILES_THREADS)
    moe_tiles(const int* __restrict__ ids, int pairs, int experts, int tile, int max_tiles,
              int* __restrict__ tiles) {
    __shared__ int count[MOE_TILES_THREADS];
    __shared__ int warp_rows[MOE_TILES_THREADS / 32], warp_tiles[MOE_TILES_THREADS / 32];
    __shared__ int total;
    const int e = threadIdx.x, lane = e & 31, warp = e >> 5;
    count[e] = 0;
    __syncthreads();
    for (int p = e; p < pairs; p += blockDim.x) atomicAdd(&count[ids[p]], 1);
    __syncthreads();
    const int rows = e < experts ? count[e] : 0, nt = (rows + tile - 1) / tile;
    int rs = rows, ts = nt;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int r2 = __shfl_up_sync(0xffffffffu, rs, o), t2 = __shfl_up_sync(0xffffffffu, ts, o);
        if (lane >= o) {
            rs += r2;
            ts += t2;
        }
    }
    if (lane == 31) {
        warp_rows[warp] = rs;
        warp_tiles[warp] = ts;
    }
    __syncthreads();
    for (int w = 0; w < warp; w++) {
        rs += warp_rows[w];
        ts += warp_tiles[w];
    }
    if (e == blockDim.x - 1) total = ts;
    const int first = rs - rows, t0 = ts - nt;
    for (int i = 0; i < nt; i++) {
        int* c = tiles + 3 * (t0 + i);
        c[0] = e;
        c[1] = first + i * tile;
        c[2] = min(tile, rows - i * tile);
    }
    __syncthreads();
    for (int s = total + e; s < max_tiles; s += blockDim.x) tiles[3 * s] = tiles[3 * s + 1] = tiles[3 * s + 2] = 0;
}

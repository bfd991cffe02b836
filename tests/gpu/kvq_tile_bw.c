/*
 * kvq_tile_bw.c — the tile-kernel benchmark as a program of its own, for
 * tests/gpu/run.sh: all the work is kvq_speed_gpu() (tests/bench/kvq_speed_gpu.cu:
 * validate against the reference, then time quantize and dequantize against a
 * device-to-device copy; last line RESULT gpu_quant_vs_d2d=.. gpu_dequant_vs_d2d=..).
 * Exit status: 0 ok, 77 no GPU, 1 a validation or CUDA failure.
 */
#include <stdio.h>

int kvq_speed_gpu(FILE *out);

int main(void)
{
    return kvq_speed_gpu(stdout);
}

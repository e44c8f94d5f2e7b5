/* linear.c's `linear` as a program: the sums of a build that Python cannot load (another architecture's, run
 * under user-mode emulation; tests/suts/fast/test_packed.py). Reads requests from stdin until it ends, each five
 * ints (M, K, N, half, scaled) and then x, the panels, the bias and (scaled) the scales, each a 64-bit byte count
 * and its bytes; writes each request's y, M x N floats, to stdout. */
#include <stdio.h>
#include <stdlib.h>

#include "linear.c"

static void *blob(void) {
    long long n;
    if (fread(&n, sizeof n, 1, stdin) != 1) exit(2);
    void *p = malloc(n > 0 ? (size_t)n : 1);
    if (!p || fread(p, 1, (size_t)n, stdin) != (size_t)n) exit(2);
    return p;
}

int main(void) {
    int h[5];
    while (fread(h, sizeof h, 1, stdin) == 1) {
        float *x = blob(), *b, *s, *y = malloc(sizeof(float) * (size_t)h[0] * (size_t)h[2]);
        void *p = blob();
        b = blob();
        s = h[4] ? blob() : NULL;
        linear(x, p, b, s, y, h[0], h[1], h[2], 1, h[3], 0);
        fwrite(y, sizeof(float), (size_t)h[0] * (size_t)h[2], stdout);
        free(x), free(p), free(b), free(s), free(y);
    }
    return 0;
}

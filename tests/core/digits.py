"""A small, generated data set of 8x8 digit images (no download): the ten
digits of a 5x3 pixel font, placed at random offsets, with pixel noise."""

import numpy as np

FONT = {
    0: ["###", "#.#", "#.#", "#.#", "###"],
    1: [".#.", "##.", ".#.", ".#.", "###"],
    2: ["###", "..#", "###", "#..", "###"],
    3: ["###", "..#", ".##", "..#", "###"],
    4: ["#.#", "#.#", "###", "..#", "..#"],
    5: ["###", "#..", "###", "..#", "###"],
    6: ["###", "#..", "###", "#.#", "###"],
    7: ["###", "..#", ".#.", ".#.", ".#."],
    8: ["###", "#.#", "###", "#.#", "###"],
    9: ["###", "#.#", "###", "..#", "###"],
}


def make_digits(n, seed=0, noise=0.25):
    """Return (images (n, 8, 8, 1) float32, labels (n,) int64)."""
    rng = np.random.default_rng(seed)
    glyphs = {d: np.array([[c == "#" for c in row] for row in rows], dtype=np.float32) for d, rows in FONT.items()}
    labels = rng.integers(0, 10, n)
    images = np.zeros((n, 8, 8, 1), dtype=np.float32)
    for i, d in enumerate(labels):
        r, c = rng.integers(0, 4), rng.integers(0, 6)
        images[i, r : r + 5, c : c + 3, 0] = glyphs[int(d)]
    images += rng.normal(0, noise, images.shape).astype(np.float32)
    return images, labels.astype(np.int64)

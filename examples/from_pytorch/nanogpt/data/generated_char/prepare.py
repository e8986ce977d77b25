"""karpathy/nanoGPT ``data/shakespeare_char/prepare.py`` ported: the same character-level
preparation (vocabulary of the characters seen, 90/10 split, uint16 ``train.bin``/``val.bin``,
``meta.pkl`` with ``stoi``/``itos``), on a generated corpus instead of the downloaded tiny
Shakespeare. MIT License, Copyright (c) 2022 Andrej Karpathy (LICENSE in ``nanogpt/``).

Run: ``python prepare.py [folder]`` writes into ``folder`` (else next to this file, as the
original). Of the original's 68 lines, 21 are changed or removed (the download, the output
folder, and the closing comment with Shakespeare's figures), and the port has 18 changed or new
lines (``difflib``, this docstring not counted): ``generated_text`` (sentences from a small
grammar, 2,000 lines, 61,856 characters, 26 symbols) for the download with ``requests``, and
``out_dir`` for ``os.path.dirname(__file__)``. ``meta.pkl`` stays a pickle, as train.py reads
it; it is written here and read back locally, never fetched.
"""
import os
import pickle
import sys
import numpy as np

def generated_text(n_lines, seed):
    """Lines from a small grammar ("the old cat sat on a red mat."): characters to learn."""
    rng = np.random.default_rng(seed)
    pick = lambda words: words[rng.integers(len(words))]
    nouns, adjs = 'cat dog bird king queen mat hill tree ship'.split(), 'old red small quiet bold'.split()
    verbs, preps = 'sat ran flew slept stood'.split(), 'on over under near by'.split()
    return ''.join(f"{pick(['the', 'a'])} {pick(adjs)} {pick(nouns)} {pick(verbs)} {pick(preps)} "
                   f"{pick(['the', 'a'])} {pick(nouns)}.\n" for _ in range(n_lines))

# generate a small corpus (nothing is downloaded) into the folder given, else next to this file
out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
os.makedirs(out_dir, exist_ok=True)
input_file_path = os.path.join(out_dir, 'input.txt')
if not os.path.exists(input_file_path):
    with open(input_file_path, 'w') as f:
        f.write(generated_text(n_lines=2000, seed=0))

with open(input_file_path, 'r') as f:
    data = f.read()
print(f"length of dataset in characters: {len(data):,}")

# get all the unique characters that occur in this text
chars = sorted(list(set(data)))
vocab_size = len(chars)
print("all the unique characters:", ''.join(chars))
print(f"vocab size: {vocab_size:,}")

# create a mapping from characters to integers
stoi = { ch:i for i,ch in enumerate(chars) }
itos = { i:ch for i,ch in enumerate(chars) }
def encode(s):
    return [stoi[c] for c in s] # encoder: take a string, output a list of integers
def decode(l):
    return ''.join([itos[i] for i in l]) # decoder: take a list of integers, output a string

# create the train and test splits
n = len(data)
train_data = data[:int(n*0.9)]
val_data = data[int(n*0.9):]

# encode both to integers
train_ids = encode(train_data)
val_ids = encode(val_data)
print(f"train has {len(train_ids):,} tokens")
print(f"val has {len(val_ids):,} tokens")

# export to bin files
train_ids = np.array(train_ids, dtype=np.uint16)
val_ids = np.array(val_ids, dtype=np.uint16)
train_ids.tofile(os.path.join(out_dir, 'train.bin'))
val_ids.tofile(os.path.join(out_dir, 'val.bin'))

# save the meta information as well, to help us encode/decode later
meta = {
    'vocab_size': vocab_size,
    'itos': itos,
    'stoi': stoi,
}
with open(os.path.join(out_dir, 'meta.pkl'), 'wb') as f:
    pickle.dump(meta, f)

"""pytorch/examples ``word_language_model/data.py`` ported to EveryO (BSD 3-Clause License,
Copyright (c) 2017, Pytorch contributors; https://github.com/pytorch/examples). 3 of the
original's 48 lines are changed (5 lines in the port, ``difflib``; this docstring and
``write_generated_corpus`` not counted): the import, and ``torch.tensor(...)``/``torch.cat``
become NumPy's (token ids are integer arrays); ``write_generated_corpus`` is new: it writes a small corpus so nothing is downloaded."""
import os
from io import open
import numpy as np

class Dictionary(object):
    def __init__(self):
        self.word2idx = {}
        self.idx2word = []

    def add_word(self, word):
        if word not in self.word2idx:
            self.idx2word.append(word)
            self.word2idx[word] = len(self.idx2word) - 1
        return self.word2idx[word]

    def __len__(self):
        return len(self.idx2word)


class Corpus(object):
    def __init__(self, path):
        self.dictionary = Dictionary()
        self.train = self.tokenize(os.path.join(path, 'train.txt'))
        self.valid = self.tokenize(os.path.join(path, 'valid.txt'))
        self.test = self.tokenize(os.path.join(path, 'test.txt'))

    def tokenize(self, path):
        """Tokenizes a text file."""
        assert os.path.exists(path)
        # Add words to the dictionary
        with open(path, 'r', encoding="utf8") as f:
            for line in f:
                words = line.split() + ['<eos>']
                for word in words:
                    self.dictionary.add_word(word)

        # Tokenize file content
        with open(path, 'r', encoding="utf8") as f:
            idss = []
            for line in f:
                words = line.split() + ['<eos>']
                ids = []
                for word in words:
                    ids.append(self.dictionary.word2idx[word])
                idss.append(np.array(ids, dtype=np.int64))
            ids = np.concatenate(idss)

        return ids


def write_generated_corpus(path, lines=(400, 40, 40), seed=0):
    """train/valid/test.txt under ``path``: sentences of a small grammar (subject, verb, object),
    so a language model has something to learn. Written once; existing files are kept."""
    rng = np.random.default_rng(seed)
    subjects, verbs = ['the cat', 'a dog', 'my friend', 'the bird', 'our teacher'], ['sees', 'likes', 'finds', 'hears']
    objects = ['the ball', 'a tree', 'the river', 'some bread', 'a small house', 'the old car']
    os.makedirs(path, exist_ok=True)
    for name, count in zip(('train', 'valid', 'test'), lines):
        target = os.path.join(path, name + '.txt')
        if not os.path.exists(target):
            with open(target, 'w', encoding='utf8') as f:
                for _ in range(count):
                    f.write(' '.join([rng.choice(subjects), rng.choice(verbs), rng.choice(objects), '.']) + '\n')

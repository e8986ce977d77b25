"""pytorch/examples ``word_language_model/model.py`` (its ``RNNModel``) ported to EveryO
(BSD 3-Clause License, Copyright (c) 2017, Pytorch contributors;
https://github.com/pytorch/examples).

Of the original's 63 lines up to ``PositionalEncoding`` (imports and ``RNNModel``), 12 are
changed or removed and the port has 9 changed or new ones (``difflib``, this docstring not
counted): the imports; ``batch_first=False`` on the
recurrent layers (EveryO defaults to batch-first, PyTorch's layout is (time, batch, features));
``self.decoder.tie_weight(self.encoder.weight)`` for PyTorch's
``self.decoder.weight = self.encoder.weight`` (EveryO's Linear weight is (in, out), an
Embedding's (vocab, dim): the tie shares the Parameter, used transposed); ``init_hidden`` makes
zeros with ``eo.zeros`` (no ``new_zeros``). ``PositionalEncoding`` and ``TransformerModel`` are
not ported: the latter subclasses ``nn.Transformer``, which EveryO does not have.
"""
import everyo as eo
from everyo import nn
import everyo as F

class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super(RNNModel, self).__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        if rnn_type in ['LSTM', 'GRU']:
            self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout, batch_first=False)
        else:
            try:
                nonlinearity = {'RNN_TANH': 'tanh', 'RNN_RELU': 'relu'}[rnn_type]
            except KeyError as e:
                raise ValueError( """An invalid option for `--model` was supplied,
                                 options are ['LSTM', 'GRU', 'RNN_TANH' or 'RNN_RELU']""") from e
            self.rnn = nn.RNN(ninp, nhid, nlayers, nonlinearity=nonlinearity, dropout=dropout, batch_first=False)
        self.decoder = nn.Linear(nhid, ntoken)

        # Optionally tie weights as in:
        # "Using the Output Embedding to Improve Language Models" (Press & Wolf 2016)
        # https://arxiv.org/abs/1608.05859
        # and
        # "Tying Word Vectors and Word Classifiers: A Loss Framework for Language Modeling" (Inan et al. 2016)
        # https://arxiv.org/abs/1611.01462
        if tie_weights:
            if nhid != ninp:
                raise ValueError('When using the tied flag, nhid must be equal to emsize')
            self.decoder.tie_weight(self.encoder.weight)

        self.init_weights()

        self.rnn_type = rnn_type
        self.nhid = nhid
        self.nlayers = nlayers

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        decoded = decoded.view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        if self.rnn_type == 'LSTM':
            return (eo.zeros(self.nlayers, bsz, self.nhid),
                    eo.zeros(self.nlayers, bsz, self.nhid))
        else:
            return eo.zeros(self.nlayers, bsz, self.nhid)

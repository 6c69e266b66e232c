"""English constituency parsing as sequence-to-sequence (paper §6.3, Table 4).

The paper trains a 4-layer Transformer (d_model 1024) on the WSJ part of the Penn Treebank,
with trees linearized as in Vinyals et al. 2015, "Grammar as a Foreign Language", and reports
section 23 F1 of 91.3 (WSJ only) and 92.7 (semi-supervised). The modules here are the data side
of that experiment; nothing in the model is parser-specific:

* :mod:`.trees`: reading bracketed treebank files (``nltk.Tree``) and normalizing them as
  parsing papers do (no traces, empty constituents, function tags or indices; POS tags kept);
* :mod:`.linearize`: trees to bracket sequences and back, with repair of malformed outputs;
* :mod:`.evalb`: bracket scoring with EVALB's COLLINS.prm conventions;
* :mod:`.synthetic_treebank`: a small English-like grammar that generates gold trees for
  tests and the demo (the Penn Treebank itself is licensed by the LDC).

The translation path of the plugin never imports this package, so fairseq loads
``--user-dir user_plugin`` without nltk; the parsing tools need it (``install_requires``).
"""

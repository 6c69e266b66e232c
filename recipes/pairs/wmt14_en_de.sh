# shellcheck shell=bash disable=SC2034
# Language pair wmt14_en_de (the name of this file): WMT14 English-German as the paper uses it
# (§5.1): Europarl v7, Common Crawl and News Commentary v9 for training (about 4.5M pairs),
# newstest2013 for development, newstest2014 (full, 3003 sentences) for test; joint byte-pair
# encoding (subword-nmt). Read by load_pair (recipes/common.sh); the steps' settings that vary
# per run (WORK_DIR, BPE_OPS, ...) are environment variables of the steps, not set here.
SRC_LANG=en
TGT_LANG=de
SUBWORD=bpe
BIG_ARCH=vaswani_big

# Training corpora: "archive|url|size in bytes|sha256|source member|target member".
# Sizes and sha256 sums as recorded in tensorflow/datasets' url_checksums for these URLs.
TRAIN_CORPORA=(
  "training-parallel-europarl-v7.tgz|https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz|657632379|0224c7c710c8a063dfd893b0cc0830202d61f4c75c17eb8e31836103d27d96e7|training/europarl-v7.de-en.en|training/europarl-v7.de-en.de"
  "training-parallel-commoncrawl.tgz|https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz|918311367|c7a74e2ea01ac6c920123108627e35278d4ccb5701e15428ffa34de86fa3a9e5|commoncrawl.de-en.en|commoncrawl.de-en.de"
  "training-parallel-nc-v9.tgz|https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz|80418416|cb8953f292298e6877ae433c98912b927cb0766b303f4540512ddd286c748485|training/news-commentary-v9.de-en.en|training/news-commentary-v9.de-en.de"
)
# Development and test sets (SGM): "archive|url|md5|source member|target member|lines".
# md5 sums as recorded in sacrebleu's dataset table (wmt13, wmt14/full).
DEV_SET="wmt13-test.tgz|https://www.statmt.org/wmt13/test.tgz|48eca5d02f637af44e85186847141f67|test/newstest2013-src.en.sgm|test/newstest2013-src.de.sgm|3000"
# the test set as the model package names it
TEST_SET_NAME=${TEST_SET_NAME:-newstest2014}
TEST_SET="wmt14-test-full.tgz|https://www.statmt.org/wmt14/test-full.tgz|a8cd784e006feb32ac6f3d9ec7eb389a|test-full/newstest2014-deen-src.en.sgm|test-full/newstest2014-deen-ref.de.sgm|3003"

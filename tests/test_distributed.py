"""numkong.distributed: a sharded corpus directory and exact top-k on a Dask LocalCluster."""
import json
import os

import numpy as np
import pytest

import numkong as nk
from numkong import distributed


def _documents(count=230, depth=48, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((int(n), depth)).astype(np.float16) for n in rng.integers(1, 70, count)]


def test_write_sharded_corpus(tmp_path):
    documents = _documents()
    sharded = distributed.write_sharded_corpus(tmp_path / "c", (d for d in documents), shard_documents=100, threads=2)
    assert len(sharded) == 230 and sharded.dtype == "float16" and sharded.depth == 48
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert [s["documents"] for s in manifest["shards"]] == [100, 100, 30]
    assert [s["first_document"] for s in manifest["shards"]] == [0, 100, 200]
    for i, shard in enumerate(manifest["shards"]):
        corpus = nk.MaxSimPackedCorpus.load(sharded.shard_path(i))
        part = documents[shard["first_document"]:shard["first_document"] + shard["documents"]]
        assert bytes(memoryview(corpus)) == bytes(memoryview(nk.maxsim_pack_corpus(part)))
    assert sorted(os.listdir(tmp_path / "c")) == ["manifest.json", "shard-00000.nkc", "shard-00001.nkc",
                                                  "shard-00002.nkc"]


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="shard_documents"):
        distributed.write_sharded_corpus(tmp_path / "c", _documents(3), shard_documents=0)
    with pytest.raises(ValueError, match="no documents"):
        distributed.write_sharded_corpus(tmp_path / "e", [])
    with pytest.raises(ValueError, match="manifest.json"):
        distributed.ShardedCorpus(tmp_path)


def test_search_on_a_local_cluster_equals_one_process(tmp_path):
    pytest.importorskip("dask.distributed")
    from dask.distributed import Client, LocalCluster

    documents = _documents()
    sharded = distributed.write_sharded_corpus(tmp_path / "c", documents, shard_documents=60)
    rng = np.random.default_rng(5)
    queries = [documents[17][:9] + rng.normal(0, 0.05, (9, 48)).astype(np.float16),
               rng.standard_normal((32, 48)).astype(np.float16)]
    whole = nk.maxsim_pack_corpus(documents)
    packed = [nk.maxsim_pack(q) for q in queries]
    expected_indices, expected_scores = nk.maxsim_packed_corpus(packed, whole, top_k=10)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        indices, scores = distributed.search(client, sharded, queries, k=10)
        single_indices, single_scores = distributed.search(client, str(tmp_path / "c"), queries[0], k=3)
        # Back-to-back searches of one query: each must scatter it anew, not reuse a key being released.
        repeated = [distributed.search(client, sharded, queries[0], k=3) for _ in range(10)]
    assert all(np.array_equal(i, single_indices) and np.array_equal(s, single_scores) for i, s in repeated)
    assert np.array_equal(indices, expected_indices) and np.array_equal(scores, expected_scores)  # bit for bit
    assert indices[0][0] == 17
    assert np.array_equal(single_indices, expected_indices[0, :3])
    assert np.array_equal(single_scores, expected_scores[0, :3])

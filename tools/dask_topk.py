"""Score a corpus sharded across Dask workers and merge their top-k into the global top-k.

Each shard is a MaxSimPackedCorpus; Dask pickles it with protocol 5, so its one buffer travels
out of band (no copy into the pickle stream) and the worker scores it with numkong itself:

    python tools/dask_topk.py            # a small demo on a LocalCluster with 2 worker processes

Usage from code:

    shards = [numkong.maxsim_pack_corpus(part) for part in parts]
    indices, scores = sharded_top_k(client, packed_query, shards, k=10)
"""
import numpy as np

import numkong as nk


def merge_top_k(shard_results, shard_offsets, k):
    """Merge per-shard (local indices, scores) into the global k best: lowest score first, ties by index."""
    indices = np.concatenate([local + offset for (local, _), offset in zip(shard_results, shard_offsets)])
    scores = np.concatenate([shard_scores for _, shard_scores in shard_results])
    order = np.lexsort((indices, scores))[:k]
    return indices[order], scores[order]


def sharded_top_k(client, query, shards, k, threads_per_shard=1):
    """Global top-k of `query` over `shards` (list of MaxSimPackedCorpus), scored on the Dask workers.

    Document i of shard s has global index sum(len(shards[:s])) + i.
    """
    offsets = np.cumsum([0] + [len(shard) for shard in shards[:-1]])
    remote_shards = client.scatter(shards)  # ships each packed buffer once, out of band
    futures = [
        client.submit(nk.maxsim_packed_corpus, query, shard, top_k=min(k, size), threads=threads_per_shard)
        for shard, size in zip(remote_shards, (len(shard) for shard in shards))
    ]
    return merge_top_k(client.gather(futures), offsets, k)


def main():
    from dask.distributed import Client, LocalCluster

    rng = np.random.default_rng(0)
    documents = [rng.standard_normal((int(n), 128)).astype(np.float32) for n in rng.integers(20, 200, 400)]
    query = nk.maxsim_pack(rng.standard_normal((32, 128)).astype(np.float32))
    shards = [nk.maxsim_pack_corpus(documents[i:i + 100]) for i in range(0, len(documents), 100)]
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True) as cluster, Client(cluster) as client:
        indices, scores = sharded_top_k(client, query, shards, k=10)
    expected_indices, expected_scores = nk.maxsim_packed_corpus(query, nk.maxsim_pack_corpus(documents), top_k=10)
    print("distributed top-10:", indices.tolist())
    print("single process    :", expected_indices.tolist())
    assert np.array_equal(indices, expected_indices) and np.array_equal(scores, expected_scores)


if __name__ == "__main__":
    main()

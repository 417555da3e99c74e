"""The capture stage: the target's features of every row, once, into a feature store, over every rank.

app.py the `capture.yaml` app; config.py its settings and their checks; identity.py what the store's content
depends on (the pipeline's capture key); shard_split.py a shard's rows and which shards each rank captures;
stage.py the stage on one rank; forward.py one target forward turned into store rows; store_writer.py the
shards, their receipts and the index, written so that any number of ranks make the store one process makes.
"""

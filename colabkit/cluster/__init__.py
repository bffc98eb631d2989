"""Past one machine: `colabkit run --cluster` on Ray (runner.py, worker.py, connect.py) and one Keras training
over several machines with MultiWorkerMirroredStrategy (multiworker.py).

Ray is optional (``pip install "colabkit[cluster]"``); nothing here imports it until a cluster is used.
"""

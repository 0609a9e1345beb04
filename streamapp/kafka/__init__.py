"""Every place where streamapp reaches inside aiokafka, Faust, mode, asyncio or prometheus_client.

Each seam is registered in :mod:`streamapp.kafka.seams` with a check of what it depends on; a
worker runs every check before it starts and refuses to start when one fails
(``streamapp check-upgrade`` runs them against the libraries' newest releases). What each seam
changes, why, what it gains and what upstream would need to make it unnecessary: docs/seams.md.
"""

"""fcache-server: the artifact cache that the processes of a node, and nodes, share.

main.py       command line -> ServerConfig -> server.serve
config.py     ServerConfig from flags, FCACHE_SERVER_* and a file; validated once
server.py     binds listeners, wires the parts together, drains on SIGTERM
servicer.py   the fcache.v1.Cache protocol; the one exception -> status-code map
storage.py    verified envelopes in the LMDB store, read-through to the upstream
leases.py     single flight per key among the server's callers
upstream.py   another fcache-server behind this one
auth.py       read and write tokens
health.py     grpc.health.v1
"""

//! Backend `tcp`: one process per rank, sockets between ranks.

//! Backend `local`: N ranks as threads of one process, exchanging through shared memory.

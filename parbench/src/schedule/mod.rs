//! Pipeline schedules as data: one list of actions per rank, in PyTorch
//! pipelining's text form (`2F0`, `1B3`, `1I3`, `1W3`).

//! TEMPORARY test communicator until comm::local lands in main.
#![cfg(test)]

use crate::comm::*;
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

pub struct Shared {
    barrier: Barrier,
    slots: Mutex<Vec<Vec<u8>>>,
}

pub struct FakeComm {
    rank: usize,
    world: usize,
    sh: Arc<Shared>,
}

pub fn run<R: Send>(world: usize, f: impl Fn(&mut FakeComm) -> R + Sync) -> Vec<R> {
    let sh = Arc::new(Shared {
        barrier: Barrier::new(world),
        slots: Mutex::new(vec![Vec::new(); world]),
    });
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|rank| {
                let sh = sh.clone();
                let f = &f;
                s.spawn(move || f(&mut FakeComm { rank, world, sh }))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

impl FakeComm {
    fn post_and_collect(&self, data: Vec<u8>) -> Vec<Vec<u8>> {
        self.sh.slots.lock().unwrap()[self.rank] = data;
        self.sh.barrier.wait();
        let all = self.sh.slots.lock().unwrap().clone();
        self.sh.barrier.wait();
        all
    }
    fn input(io: &Io<'_, HostBuffer>, n: usize) -> Vec<u8> {
        match io {
            Io::InPlace(b) => b.bytes()[..n].to_vec(),
            Io::OutOfPlace { send, .. } => send.bytes()[..n].to_vec(),
        }
    }
    fn out<'a>(io: &'a mut Io<'_, HostBuffer>) -> &'a mut HostBuffer {
        match io {
            Io::InPlace(b) => b,
            Io::OutOfPlace { recv, .. } => recv,
        }
    }
}

impl Communicator for FakeComm {
    type Buffer = HostBuffer;
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn backend(&self) -> &'static str {
        "fake"
    }
    fn wire(&self) -> String {
        "fake".into()
    }
    fn algo_for(&self, _: Collective, _: usize) -> String {
        "fake".into()
    }
    fn set_timeout(&mut self, _: Duration) {}
    fn timeout(&self) -> Duration {
        Duration::from_secs(60)
    }
    fn alloc(&self, bytes: usize) -> CommResult<HostBuffer> {
        Ok(HostBuffer::zeroed(bytes))
    }
    fn all_reduce(
        &mut self,
        mut io: Io<'_, HostBuffer>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> CommResult<()> {
        let n = count * dtype.size();
        let all = self.post_and_collect(Self::input(&io, n));
        let mut acc = all[0].clone();
        for o in &all[1..] {
            reduce_bytes(&mut acc, o, dtype, op);
        }
        Self::out(&mut io).bytes_mut()[..n].copy_from_slice(&acc);
        Ok(())
    }
    fn all_gather(
        &mut self,
        mut io: Io<'_, HostBuffer>,
        count: usize,
        dtype: DType,
    ) -> CommResult<()> {
        let n = count * dtype.size();
        let mine = match &io {
            Io::InPlace(b) => b.bytes()[self.rank * n..(self.rank + 1) * n].to_vec(),
            Io::OutOfPlace { send, .. } => send.bytes()[..n].to_vec(),
        };
        let all = self.post_and_collect(mine);
        let out = Self::out(&mut io);
        for (r, d) in all.iter().enumerate() {
            out.bytes_mut()[r * n..(r + 1) * n].copy_from_slice(d);
        }
        Ok(())
    }
    fn reduce_scatter(
        &mut self,
        mut io: Io<'_, HostBuffer>,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> CommResult<()> {
        let n = count * dtype.size();
        let all = self.post_and_collect(Self::input(&io, n * self.world));
        let r = self.rank;
        let mut acc = all[0][r * n..(r + 1) * n].to_vec();
        for o in &all[1..] {
            reduce_bytes(&mut acc, &o[r * n..(r + 1) * n], dtype, op);
        }
        let off = if matches!(io, Io::InPlace(_)) {
            r * n
        } else {
            0
        };
        Self::out(&mut io).bytes_mut()[off..off + n].copy_from_slice(&acc);
        Ok(())
    }
    fn broadcast(
        &mut self,
        mut io: Io<'_, HostBuffer>,
        count: usize,
        dtype: DType,
        root: usize,
    ) -> CommResult<()> {
        let n = count * dtype.size();
        let all = self.post_and_collect(Self::input(&io, n));
        Self::out(&mut io).bytes_mut()[..n].copy_from_slice(&all[root]);
        Ok(())
    }
    fn reduce(
        &mut self,
        _: Io<'_, HostBuffer>,
        _: usize,
        _: DType,
        _: ReduceOp,
        _: usize,
    ) -> CommResult<()> {
        Err(CommError::Unsupported("fake".into()))
    }
    fn all_to_all(&mut self, _: Io<'_, HostBuffer>, _: usize, _: DType) -> CommResult<()> {
        Err(CommError::Unsupported("fake".into()))
    }
    fn send(&mut self, _: &HostBuffer, _: usize, _: DType, _: usize) -> CommResult<()> {
        Err(CommError::Unsupported("fake".into()))
    }
    fn recv(&mut self, _: &mut HostBuffer, _: usize, _: DType, _: usize) -> CommResult<()> {
        Err(CommError::Unsupported("fake".into()))
    }
    fn send_recv(
        &mut self,
        _: &HostBuffer,
        _: usize,
        _: &mut HostBuffer,
        _: usize,
        _: usize,
        _: DType,
    ) -> CommResult<()> {
        Err(CommError::Unsupported("fake".into()))
    }
    fn barrier(&mut self) -> CommResult<()> {
        self.sh.barrier.wait();
        Ok(())
    }
}

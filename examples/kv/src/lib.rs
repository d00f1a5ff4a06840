//! rdmx-kv: a key-value store on rdmx. The server keeps a hash table in registered memory
//! ([`table`]); PUT and DEL go through rdmx-rpc; GET goes through rdmx-rpc too, or
//! one-sided: the client reads the key's slots straight from the server's memory with RDMA
//! READ, and the server's CPU takes no part (the Pilaf / FaRM design).
//!
//! ```no_run
//! let server = rdmx_kv::KvServer::start("127.0.0.1:7100", rdmx_kv::ServerOptions::default())?;
//! let client = rdmx_kv::KvClient::connect(server.local_addr())?;
//! client.put(b"k", b"v")?;
//! assert_eq!(client.get_one_sided(b"k")?, Some(b"v".to_vec()));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod bench;
pub mod table;
pub mod workload;

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use rdmx::rpc::{Client, ClientConfig, Method, Server, ServerConfig, Service, Status};
use rdmx::{Context, Endpoint, RemoteAccess, RemoteRegion};
use serde::{Deserialize, Serialize};

use table::{Layout, PROBE, SlotView, Table, view};

/// What a client learns when it connects: where the table is and its shape.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct TableInfo {
    /// The region's address, length and key.
    pub addr: u64,
    /// Its length.
    pub len: u64,
    /// Its remote key.
    pub rkey: u32,
    /// The table's shape.
    pub layout: Layout,
}

/// The methods of the store.
pub mod methods {
    use super::{Method, TableInfo};

    /// The table's place and shape.
    pub const INFO: Method<(), TableInfo> = Method::new("kv.info");
    /// The value of a key (through the server).
    pub const GET: Method<Vec<u8>, Option<Vec<u8>>> = Method::new("kv.get");
    /// Sets a key.
    pub const PUT: Method<(Vec<u8>, Vec<u8>), ()> = Method::new("kv.put");
    /// Deletes a key; whether it was there.
    pub const DEL: Method<Vec<u8>, bool> = Method::new("kv.del");
}

/// How a server is made.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Slots (rounded up to a power of two).
    pub slots: u64,
    /// Longest value.
    pub max_value: u32,
    /// Threads that serve every client from the context's one receive (a `LinkSet`): each
    /// takes what came from all clients and answers it in one send batch. 0: a reader
    /// thread per client instead (measured: as fast for one client, ten times slower for 50
    /// connections driven by two threads, whose every wave wakes 50 server threads).
    pub readers: usize,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            slots: 1 << 16,
            max_value: 1024,
            readers: 1,
        }
    }
}

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    /// The transport's.
    #[error(transparent)]
    Rdmx(#[from] rdmx::Error),
    /// A call's.
    #[error(transparent)]
    Rpc(#[from] Status),
    /// The OS's.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The table's layout from the server is not usable.
    #[error("the server's table layout is not usable: {0}")]
    Layout(String),
}

/// A running server: accepts clients and serves each on its own link.
#[derive(Debug)]
pub struct KvServer {
    addr: SocketAddr,
    table: Arc<Table>,
    server: Server,
    _ctx: Context,
}

impl KvServer {
    /// Starts a server listening on `addr` (port 0: a free one), its table made from
    /// `opts`.
    ///
    /// # Errors
    /// [`KvError`].
    pub fn start(addr: impl ToSocketAddrs, opts: ServerOptions) -> Result<Self, KvError> {
        let ctx = Context::builder().build()?;
        let layout = Layout {
            slots: opts.slots.max(PROBE as u64).next_power_of_two(),
            max_value: opts.max_value,
        };
        // Clients only read it (GET); every change goes through the server.
        let region = ctx.register_with(layout.region_len(), RemoteAccess::Read)?;
        let table = Arc::new(Table::new(region, layout));
        let t = Arc::clone(&table);
        let info = TableInfo {
            addr: t.remote().addr,
            len: t.remote().len,
            rkey: t.remote().rkey,
            layout,
        };
        let (t1, t2, t3) = (Arc::clone(&table), Arc::clone(&table), Arc::clone(&table));
        let service = Service::builder()
            .method(methods::INFO, move |_, ()| Ok(info))
            .method(methods::GET, move |_, k: Vec<u8>| Ok(t1.get(&k)))
            .method(methods::PUT, move |_, (k, v): (Vec<u8>, Vec<u8>)| {
                t2.put(&k, &v).map_err(|e| match e {
                    table::TableError::Full => Status::resource_exhausted(e.to_string()),
                    _ => Status::invalid_argument(e.to_string()),
                })
            })
            .method(methods::DEL, move |_, k: Vec<u8>| Ok(t3.delete(&k)))
            .build()
            .map_err(|e| KvError::Layout(e.to_string()))?;
        // Handlers are short: each client's run on its link's reader thread.
        let server = Server::new(
            service,
            ServerConfig {
                threads: 0,
                ..ServerConfig::default()
            },
        )?;
        let listener = ctx.listen(addr)?;
        let local = listener.local_addr();
        let s = server.clone();
        if opts.readers > 0 {
            let set = rdmx::rpc::LinkSet::new();
            s.serve_set(Arc::clone(&set), ctx.clone(), opts.readers)?;
            std::thread::Builder::new()
                .name("rdmx-kv-accept".into())
                .spawn(move || {
                    while let Ok(ep) = listener.accept() {
                        // (Clients that went away leave the set as others come.)
                        set.retain(Endpoint::is_connected);
                        set.insert(ep.id(), ep);
                    }
                })?;
        } else {
            std::thread::Builder::new()
                .name("rdmx-kv-accept".into())
                .spawn(move || {
                    while let Ok(ep) = listener.accept() {
                        if s.serve(ep).is_err() {
                            break;
                        }
                    }
                })?;
        }
        Ok(Self {
            addr: local,
            table,
            server,
            _ctx: ctx,
        })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The table (for tests and local use).
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// The RPC server's counters.
    pub fn rpc_stats(&self) -> rdmx::rpc::ServerStats {
        self.server.stats()
    }
}

/// Retries of a one-sided read that found a slot being written, before asking the server.
pub const READ_RETRIES: u32 = 64;

/// A client of one server.
#[derive(Debug)]
pub struct KvClient {
    ep: Arc<Endpoint>,
    rpc: Client<Arc<Endpoint>>,
    remote: RemoteRegion,
    layout: Layout,
    _ctx: Context,
}

/// Counters of one-sided reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadStats {
    /// Slot reads that found a slot being written (read again).
    pub retries: u64,
    /// GETs that gave up reading and asked the server.
    pub fallbacks: u64,
}

impl KvClient {
    /// Connects to the server at `addr` (a context of its own).
    ///
    /// # Errors
    /// [`KvError`].
    pub fn connect(addr: impl ToSocketAddrs) -> Result<Self, KvError> {
        let ctx = Context::builder().build()?;
        Self::connect_on(&ctx, addr)
    }

    /// Connects to the server at `addr` on context `ctx` (many clients of one process
    /// share a context: one device, one progress thread).
    ///
    /// # Errors
    /// [`KvError`].
    pub fn connect_on(ctx: &Context, addr: impl ToSocketAddrs) -> Result<Self, KvError> {
        let ctx = ctx.clone();
        let ep = Arc::new(ctx.connect(addr)?);
        let rpc = Client::new(
            Arc::clone(&ep),
            ClientConfig {
                timeout: Duration::from_secs(10),
                ..ClientConfig::default()
            },
        )?;
        let info = rpc.call(methods::INFO, &())?;
        let layout = info.layout;
        // (From the peer: checked before any size is computed from it.)
        let usable = layout.slots.is_power_of_two()
            && layout.slots <= 1 << 32
            && layout.max_value <= 64 << 20
            && (layout.slot_len() as u64)
                .checked_mul(layout.slots)
                .is_some_and(|n| n <= info.len);
        if !usable {
            return Err(KvError::Layout(format!("{info:?}")));
        }
        Ok(Self {
            ep,
            rpc,
            remote: RemoteRegion {
                addr: info.addr,
                len: info.len,
                rkey: info.rkey,
            },
            layout,
            _ctx: ctx,
        })
    }

    /// The RPC client (for pipelined calls).
    pub fn rpc(&self) -> &Client<Arc<Endpoint>> {
        &self.rpc
    }

    /// The table's shape.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Sets `key` to `value` (through the server).
    ///
    /// # Errors
    /// The call's status (`InvalidArgument` for a key or value the table does not take,
    /// `ResourceExhausted` when the key's slots are taken).
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<(), Status> {
        self.rpc.call(methods::PUT, &(key.to_vec(), value.to_vec()))
    }

    /// Deletes `key` (through the server); whether it was there.
    ///
    /// # Errors
    /// The call's status.
    pub fn del(&self, key: &[u8]) -> Result<bool, Status> {
        self.rpc.call(methods::DEL, &key.to_vec())
    }

    /// The value of `key`, through the server.
    ///
    /// # Errors
    /// The call's status.
    pub fn get_rpc(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Status> {
        self.rpc.call(methods::GET, &key.to_vec())
    }

    /// The value of `key`, read from the server's memory with RDMA READ (slot by slot
    /// along its probe); a slot being written is read again, and after
    /// [`READ_RETRIES`] the server is asked.
    ///
    /// # Errors
    /// The transport's, or the fallback call's.
    pub fn get_one_sided(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        let mut stats = ReadStats::default();
        self.get_one_sided_counted(key, &mut stats)
    }

    /// [`get_one_sided`](Self::get_one_sided), counting its retries and fallbacks.
    ///
    /// # Errors
    /// As `get_one_sided`.
    pub fn get_one_sided_counted(
        &self,
        key: &[u8],
        stats: &mut ReadStats,
    ) -> Result<Option<Vec<u8>>, KvError> {
        self.start_get_one_sided(key)?.finish(stats)
    }

    /// Starts a one-sided GET: the read of the key's home slot is posted and this returns
    /// at once, so that one thread has the GETs of many connections in flight together;
    /// [`PendingGet::finish`] takes the slot and goes on along the probe if the key is not
    /// at home.
    ///
    /// # Errors
    /// [`KvError`] when the read cannot be posted.
    pub fn start_get_one_sided<'a>(&'a self, key: &'a [u8]) -> Result<PendingGet<'a>, KvError> {
        let home = self.layout.home(key);
        let len = self.layout.slot_len();
        let s = self.layout.probe(home, 0);
        let first = self.ep.start_read(&self.remote, s * len as u64, len)?;
        Ok(PendingGet {
            c: self,
            key,
            first: Some(first),
        })
    }
}

/// A one-sided GET under way ([`KvClient::start_get_one_sided`]).
#[derive(Debug)]
pub struct PendingGet<'a> {
    c: &'a KvClient,
    key: &'a [u8],
    first: Option<rdmx::PendingOp<'a, rdmx::Buf>>,
}

impl PendingGet<'_> {
    /// Waits for the home slot and reads on along the probe as needed: the value, or
    /// `None` when the key is not there. A slot caught being written is read again (at
    /// most [`READ_RETRIES`] times, then the server is asked).
    ///
    /// # Errors
    /// [`KvError`].
    pub fn finish(mut self, stats: &mut ReadStats) -> Result<Option<Vec<u8>>, KvError> {
        let (c, key) = (self.c, self.key);
        let home = c.layout.home(key);
        let len = c.layout.slot_len();
        for i in 0..PROBE {
            let s = c.layout.probe(home, i);
            let mut tries = 0;
            loop {
                let bytes = match self.first.take() {
                    Some(op) => op.wait()?,
                    None => c.ep.read(&c.remote, s * len as u64, len)?,
                };
                match view(&bytes, &c.layout) {
                    SlotView::Live { key: k, value, .. } if k == key => return Ok(Some(value)),
                    SlotView::Free { never_used: true } => return Ok(None),
                    SlotView::Unstable => {
                        stats.retries += 1;
                        tries += 1;
                        if tries >= READ_RETRIES {
                            stats.fallbacks += 1;
                            return Ok(c.get_rpc(key)?);
                        }
                        std::thread::yield_now();
                    }
                    _ => break,
                }
            }
        }
        Ok(None)
    }
}

//! A TCP forwarder on loopback between geogate and its broker: it adds a
//! fixed delay each way (a slow link), can cut every connection at once (a
//! network fault with the broker still up), and can watch the MQTT packets
//! it carries to judge geogate's acks connection by connection.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// Tells whether geogate has finished the message with this payload.
pub type Finished = Box<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// What the observer saw, over every connection.
#[derive(Debug, Default, Clone)]
pub struct AckReport {
    pub connections: usize,
    /// QoS 1 publishes the broker sent to geogate.
    pub publishes: usize,
    /// PubAcks that matched an outstanding publish of their connection.
    pub good_acks: usize,
    /// PubAcks for an id not outstanding on their connection (stale, or a
    /// second ack of the same message).
    pub stale_or_double: Vec<(usize, u16)>,
    /// PubAcks sent before geogate had finished the message they ack.
    pub early: Vec<(usize, u16, String)>,
    /// PubAcks that came after the ack of a later publish on their
    /// connection (MQTT asks for PUBACKs in PUBLISH order).
    pub out_of_order: Vec<(usize, u16)>,
}

struct Observer {
    finished: Finished,
    /// Per connection: packet id → (arrival number, payload) of
    /// outstanding QoS 1 publishes; a publish's arrival number is the
    /// count of publishes seen with it (`report.publishes`).
    outstanding: HashMap<usize, HashMap<u16, (usize, Vec<u8>)>>,
    /// Per connection: the arrival number of the last publish acked.
    last_acked: HashMap<usize, usize>,
    report: AckReport,
}

/// What the proxy does to the broker's next SUBACKs, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubackTamper {
    /// Swallow it: the client never hears back.
    Drop,
    /// Turn every return code into 0x80 (failure), as a refusing ACL would.
    Refuse,
}

struct Shared {
    upstream: u16,
    delay: Duration,
    observer: Option<Mutex<Observer>>,
    subacks: Mutex<std::collections::VecDeque<SubackTamper>>,
    /// Deliver QoS 1 publishes to the client in swapped pairs (2, 1, 4,
    /// 3, ...), as a broker that lets newer messages overtake older ones.
    swap_pairs: AtomicBool,
    open: Mutex<Vec<TcpStream>>,
    stopped: AtomicBool,
}

pub struct Proxy {
    pub port: u16,
    shared: Arc<Shared>,
}

impl Proxy {
    /// Forwards 127.0.0.1:`port` to 127.0.0.1:`upstream`, `delay` each way.
    pub fn start(upstream: u16, delay: Duration) -> Self {
        Self::spawn(upstream, delay, None)
    }

    /// Like [`Self::start`], also judging every PubAck geogate sends.
    pub fn observing(upstream: u16, finished: Finished) -> Self {
        let observer = Observer {
            finished,
            outstanding: HashMap::new(),
            last_acked: HashMap::new(),
            report: AckReport::default(),
        };
        Self::spawn(upstream, Duration::ZERO, Some(Mutex::new(observer)))
    }

    /// Like [`Self::start`] with no delay, delivering QoS 1 publishes in
    /// swapped pairs: a deterministic reordering broker.
    pub fn swapping_publishes(upstream: u16) -> Self {
        let proxy = Self::spawn(upstream, Duration::ZERO, None);
        proxy.shared.swap_pairs.store(true, Ordering::Release);
        proxy
    }

    /// Like [`Self::start`] with no delay, tampering with the broker's
    /// first SUBACKs as `tampers` says.
    pub fn tampering_subacks(upstream: u16, tampers: &[SubackTamper]) -> Self {
        let proxy = Self::spawn(upstream, Duration::ZERO, None);
        proxy.shared.subacks.lock().unwrap().extend(tampers);
        proxy
    }

    fn spawn(upstream: u16, delay: Duration, observer: Option<Mutex<Observer>>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let shared = Arc::new(Shared {
            upstream,
            delay,
            observer,
            subacks: Mutex::new(Default::default()),
            swap_pairs: AtomicBool::new(false),
            open: Mutex::new(Vec::new()),
            stopped: AtomicBool::new(false),
        });
        let accept = shared.clone();
        std::thread::spawn(move || {
            for (id, client) in listener.incoming().enumerate() {
                if accept.stopped.load(Ordering::Acquire) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", accept.upstream)) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                if let Some(o) = &accept.observer {
                    o.lock().unwrap().report.connections += 1;
                }
                {
                    let mut open = accept.open.lock().unwrap();
                    open.push(client.try_clone().expect("clone"));
                    open.push(server.try_clone().expect("clone"));
                }
                pipe(
                    &accept,
                    id,
                    client.try_clone().expect("clone"),
                    server.try_clone().expect("clone"),
                    Direction::ToBroker,
                );
                pipe(&accept, id, server, client, Direction::ToClient);
            }
        });
        Self { port, shared }
    }

    /// Cuts every open connection (both ends), as a network fault would.
    pub fn cut(&self) {
        for s in self.shared.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    pub fn report(&self) -> AckReport {
        self.shared
            .observer
            .as_ref()
            .map(|o| o.lock().unwrap().report.clone())
            .unwrap_or_default()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::Release);
        self.cut();
        // Wake the accept loop so it sees `stopped`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Direction {
    ToBroker,
    ToClient,
}

/// Copies `from` → `to` through a delay line, parsing MQTT on the way.
fn pipe(shared: &Arc<Shared>, conn: usize, mut from: TcpStream, mut to: TcpStream, dir: Direction) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let reader_shared = shared.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut parser = Parser::default();
        // Parsed only when something looks inside; otherwise raw bytes.
        let swap = dir == Direction::ToClient && reader_shared.swap_pairs.load(Ordering::Acquire);
        let mut held: Option<Packet> = None;
        let parse = reader_shared.observer.is_some()
            || swap
            || (dir == Direction::ToClient && !reader_shared.subacks.lock().unwrap().is_empty());
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let bytes = if parse {
                let mut out = Vec::with_capacity(n);
                for mut packet in parser.feed(&buf[..n]) {
                    if let Some(o) = &reader_shared.observer {
                        observe(&mut o.lock().unwrap(), conn, dir, &packet);
                    }
                    if dir == Direction::ToClient && packet.first >> 4 == 9 {
                        match reader_shared.subacks.lock().unwrap().pop_front() {
                            Some(SubackTamper::Drop) => continue,
                            Some(SubackTamper::Refuse) => {
                                for code in packet.body.iter_mut().skip(2) {
                                    *code = 0x80;
                                }
                            }
                            None => {}
                        }
                    }
                    if swap && packet.first >> 4 == 3 && (packet.first >> 1) & 3 > 0 {
                        match held.take() {
                            None => held = Some(packet),
                            Some(first) => {
                                packet.encode(&mut out);
                                first.encode(&mut out);
                            }
                        }
                        continue;
                    }
                    packet.encode(&mut out);
                }
                out
            } else {
                buf[..n].to_vec()
            };
            if tx
                .send((Instant::now() + reader_shared.delay, bytes))
                .is_err()
            {
                break;
            }
        }
        let _ = from.shutdown(Shutdown::Read);
    });
    std::thread::spawn(move || {
        while let Ok((due, bytes)) = rx.recv() {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// One MQTT control packet: its first byte and its body.
struct Packet {
    first: u8,
    body: Vec<u8>,
}

impl Packet {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.first);
        let mut len = self.body.len();
        loop {
            let mut byte = (len % 128) as u8;
            len /= 128;
            if len > 0 {
                byte |= 0x80;
            }
            out.push(byte);
            if len == 0 {
                break;
            }
        }
        out.extend_from_slice(&self.body);
    }
}

/// Splits a byte stream into MQTT packets (fixed header + remaining length).
#[derive(Default)]
struct Parser {
    buf: Vec<u8>,
}

impl Parser {
    fn feed(&mut self, bytes: &[u8]) -> Vec<Packet> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        loop {
            let mut len = 0usize;
            let mut shift = 0;
            let mut i = 1;
            let complete_header = loop {
                let Some(&b) = self.buf.get(i) else {
                    break false;
                };
                len |= ((b & 0x7f) as usize) << shift;
                shift += 7;
                i += 1;
                if b & 0x80 == 0 {
                    break true;
                }
            };
            if !complete_header || self.buf.len() < i + len {
                return out;
            }
            let first = self.buf[0];
            let body = self.buf[i..i + len].to_vec();
            self.buf.drain(..i + len);
            out.push(Packet { first, body });
        }
    }
}

fn observe(o: &mut Observer, conn: usize, dir: Direction, p: &Packet) {
    let kind = p.first >> 4;
    match (dir, kind) {
        (Direction::ToClient, 3) => {
            let qos = (p.first >> 1) & 3;
            if qos == 0 || p.body.len() < 2 {
                return;
            }
            let topic_len = u16::from_be_bytes([p.body[0], p.body[1]]) as usize;
            let Some(id) = p.body.get(2 + topic_len..4 + topic_len) else {
                return;
            };
            let pkid = u16::from_be_bytes([id[0], id[1]]);
            let payload = p.body[4 + topic_len..].to_vec();
            o.report.publishes += 1;
            o.outstanding
                .entry(conn)
                .or_default()
                .insert(pkid, (o.report.publishes, payload));
        }
        (Direction::ToBroker, 4) if p.body.len() >= 2 => {
            let pkid = u16::from_be_bytes([p.body[0], p.body[1]]);
            match o.outstanding.entry(conn).or_default().remove(&pkid) {
                None => o.report.stale_or_double.push((conn, pkid)),
                Some((arrival, payload)) => {
                    let last = o.last_acked.entry(conn).or_default();
                    if arrival < *last {
                        o.report.out_of_order.push((conn, pkid));
                    }
                    *last = arrival.max(*last);
                    if (o.finished)(&payload) {
                        o.report.good_acks += 1;
                    } else {
                        let text = String::from_utf8_lossy(&payload).into_owned();
                        o.report.early.push((conn, pkid, text));
                    }
                }
            }
        }
        _ => {}
    }
}

//! Real Redis for integration tests: a throwaway `redis-server`, or a 3-master Redis Cluster, on
//! free ports, each node in its own temp dir, killed on drop. `cli` runs redis-cli against a
//! node so tests can check what landed in Redis independently of the code under test.
//!
//! `start_acl` (either kind) protects every node: the `default` user gets `ADMIN_PASSWORD`
//! (what `cli` logs in with), and an ACL user of the test's choosing has every permission; the
//! node under test is given that user's URL.
//!
//! `start_tls` (either kind) makes every node TLS-only (`--port 0 --tls-port P`, a cluster's bus
//! and replication too), presenting a certificate pair the test made (`support::certs::Ca`), and not
//! asking clients for one; `url` is then `rediss://`. The helpers' own redis-cli connects over
//! TLS without verifying: what is under test is the node's verification.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// Starts tried before giving up; a start fails when another process grabs the port between
/// our probe and redis-server's bind.
const START_ATTEMPTS: usize = 5;
const READY_WITHIN: Duration = Duration::from_secs(10);
const CLUSTER_READY_WITHIN: Duration = Duration::from_secs(30);
/// The `default` user's password on a server or cluster started with `start_acl`.
pub const ADMIN_PASSWORD: &str = "admin-only-for-redis-cli";

pub struct RedisServer {
    port: u16,
    /// Cluster bus port, for cluster nodes.
    bus_port: Option<u16>,
    extra: Vec<String>,
    /// The `default` user's (`--requirepass`): what `cli` logs in with.
    password: Option<String>,
    /// The ACL user and password `url` names instead, from `start_acl`.
    acl_user: Option<(String, String)>,
    /// TLS-only, from `start_tls`.
    tls: Option<ServerTls>,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

/// The files a TLS-only server is started with. It reads them at every (re)start: a test that
/// writes another pair over them and restarts the server has it present that one.
#[derive(Clone, Debug)]
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// What the server trusts (for its cluster bus and replication links).
    pub ca: PathBuf,
}

impl ServerTls {
    /// A certificate chain and key (a `support::certs::Pair`'s), and the CA file.
    pub fn new(cert: &Path, key: &Path, ca: &Path) -> ServerTls {
        ServerTls {
            cert: cert.to_owned(),
            key: key.to_owned(),
            ca: ca.to_owned(),
        }
    }

    /// redis-server's arguments for TLS on `port` only (with `cluster`, the bus and
    /// replication too).
    fn arguments(&self, port: &str, cluster: bool) -> Vec<String> {
        let path = |p: &PathBuf| p.to_str().expect("utf-8 TLS file path").to_owned();
        let mut args = vec![
            "--port".to_owned(),
            "0".to_owned(),
            "--tls-port".to_owned(),
            port.to_owned(),
            "--tls-cert-file".to_owned(),
            path(&self.cert),
            "--tls-key-file".to_owned(),
            path(&self.key),
            "--tls-ca-cert-file".to_owned(),
            path(&self.ca),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
        ];
        if cluster {
            for arg in ["--tls-cluster", "yes", "--tls-replication", "yes"] {
                args.push(arg.to_owned());
            }
        }
        args
    }
}

/// redis-cli's arguments for a server with `tls`: TLS, not verified.
fn cli_tls(tls: &Option<ServerTls>) -> &'static [&'static str] {
    match tls {
        Some(_) => &["--tls", "--insecure"],
        None => &[],
    }
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// With extra redis-server arguments, e.g. `&["--requirepass", "s3cret"]` (`cli` and `url`
    /// then carry the password).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        RedisServer::launch(extra, false, None)
    }

    /// Protected: the `default` user needs `ADMIN_PASSWORD`, and the ACL user `user` (every
    /// key, channel and command) `password`; `url` names `user:password` (percent-encoded).
    pub fn start_acl(user: &str, password: &str) -> RedisServer {
        RedisServer::start_as(None, Some((user, password)))
    }

    /// TLS-only with `tls`'s certificate pair, and protected as by `start_acl` when `acl`
    /// names a user and password; `url` is `rediss://…`.
    pub fn start_tls(tls: &ServerTls, acl: Option<(&str, &str)>) -> RedisServer {
        RedisServer::start_as(Some(tls), acl)
    }

    fn start_as(tls: Option<&ServerTls>, acl: Option<(&str, &str)>) -> RedisServer {
        let mut server = RedisServer::launch(&strs(&acl_arguments(acl)), false, tls);
        server.acl_user = owned(acl);
        server
    }

    fn launch(extra: &[&str], cluster: bool, tls: Option<&ServerTls>) -> RedisServer {
        let mut last_error = String::new();
        for _ in 0..START_ATTEMPTS {
            let mut server = RedisServer {
                port: free_port(),
                bus_port: cluster.then(free_port),
                extra: extra.iter().map(|a| a.to_string()).collect(),
                password: extra
                    .windows(2)
                    .find(|w| w[0] == "--requirepass")
                    .map(|w| w[1].to_string()),
                acl_user: None,
                tls: tls.cloned(),
                dir: tempfile::tempdir().expect("temp dir for redis-server"),
                child: None,
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("redis-server did not start after {START_ATTEMPTS} attempts: {last_error}");
    }

    /// Runs redis-server on this server's port and waits until it answers PING.
    fn spawn(&mut self) -> Result<(), String> {
        let port = self.port.to_string();
        let dir = self.dir.path().to_str().expect("utf-8 temp dir");
        let log = self.dir.path().join("redis.log");
        let mut cmd = Command::new("redis-server");
        match &self.tls {
            Some(tls) => cmd.args(tls.arguments(&port, self.bus_port.is_some())),
            None => cmd.args(["--port", &port]),
        };
        cmd.args(["--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no", "--daemonize", "no", "--dir", dir])
            .args(["--logfile", log.to_str().expect("utf-8 log path")]);
        if let Some(bus) = self.bus_port {
            cmd.args([
                "--cluster-enabled",
                "yes",
                "--cluster-port",
                &bus.to_string(),
            ])
            .args(["--cluster-config-file", "nodes.conf"])
            .args(["--cluster-node-timeout", "5000"]);
        }
        let mut child = cmd
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run redis-server (is it installed at /usr/bin/redis-server?)");
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Some(status) = child.try_wait().expect("poll redis-server") {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!("port {port}: exited with {status}; log:\n{log}"));
            }
            if self.answers_ping() {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "port {port}: no PING answer within {READY_WITHIN:?}"
                ));
            }
            sleep(Duration::from_millis(10));
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A replica of this (plain, password-less) server, `--replicaof`, returned once this
    /// server lists a replica online.
    pub fn start_replica(&self) -> RedisServer {
        let master = self.port.to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master]);
        let deadline = Instant::now() + READY_WITHIN;
        while !self.cli(&["INFO", "replication"]).contains("state=online") {
            assert!(
                Instant::now() < deadline,
                "replica {} not online within {READY_WITHIN:?}",
                replica.port
            );
            sleep(Duration::from_millis(20));
        }
        replica
    }

    /// `redis[s]://[[user]:password@]127.0.0.1:PORT`: the ACL user's, else the `default` user's
    /// password if it has one; `rediss` for a TLS-only server.
    pub fn url(&self) -> String {
        format!(
            "{}://{}127.0.0.1:{}",
            self.scheme(),
            self.credentials(),
            self.port
        )
    }

    fn scheme(&self) -> &'static str {
        match self.tls {
            Some(_) => "rediss",
            None => "redis",
        }
    }

    /// Up means answering PING, or refusing it for want of a password.
    fn answers_ping(&self) -> bool {
        if self.tls.is_none() {
            return answers_ping(self.port);
        }
        Command::new("redis-cli")
            .args(cli_tls(&self.tls))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "PING"])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .is_ok_and(|out| {
                let reply = String::from_utf8_lossy(&out.stdout);
                reply.starts_with("PONG") || reply.starts_with("NOAUTH")
            })
    }

    /// `user:password@` (percent-encoded), `:password@` or nothing, as `url` writes them.
    fn credentials(&self) -> String {
        match (&self.acl_user, &self.password) {
            (Some((user, password)), _) => format!("{}:{}@", escape(user), escape(password)),
            (None, Some(password)) => format!(":{}@", escape(password)),
            (None, None) => String::new(),
        }
    }

    /// The `user=` of every connection the server lists (this redis-cli's own among them).
    pub fn users(&self) -> Vec<String> {
        self.cli(&["CLIENT", "LIST"])
            .lines()
            .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("user=")))
            .map(str::to_owned)
            .collect()
    }

    /// Asserts that at least `at_least` connections are logged in as `user`, and that the only
    /// `default` one (what a connection is before AUTH) is this redis-cli's.
    pub fn assert_logged_in_as(&self, user: &str, at_least: usize) {
        let users = self.users();
        assert!(
            users.iter().filter(|u| *u == user).count() >= at_least,
            "{users:?}"
        );
        assert_eq!(
            users.iter().filter(|u| *u == "default").count(),
            1,
            "{users:?}"
        );
    }

    /// Changes the `default` user's password (`CONFIG SET requirepass`), which `cli` then logs
    /// in with. Connections already logged in stay so.
    pub fn set_requirepass(&mut self, password: &str) {
        assert_eq!(self.cli(&["CONFIG", "SET", "requirepass", password]), "OK");
        self.password = Some(password.to_owned());
    }

    /// Kills the server (SIGKILL: connections die without a goodbye) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the server with SIGSTOP and returns once the kernel reports every one of its
    /// threads stopped: from then on it answers nothing (connections stay open and what
    /// clients send waits in the socket buffers) until `resume`. Unlike a `DEBUG SLEEP`, the
    /// pause starts before this returns and lasts as long as the test needs, however slow the
    /// machine.
    pub fn pause(&self) {
        let pid = self.signal("STOP");
        let deadline = Instant::now() + READY_WITHIN;
        while !all_threads_stopped(pid) {
            assert!(
                Instant::now() < deadline,
                "redis-server {pid} not stopped within {READY_WITHIN:?}"
            );
            sleep(Duration::from_millis(1));
        }
    }

    /// Lets a `pause`d server run again (SIGCONT); it then answers what queued up meanwhile.
    pub fn resume(&self) {
        self.signal("CONT");
    }

    /// Sends SIGname to the running server with kill(1); its pid.
    fn signal(&self, name: &str) -> u32 {
        let pid = self.child.as_ref().expect("redis-server is running").id();
        let status = Command::new("kill")
            .args([&format!("-{name}"), &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} {pid}: {status}");
        pid
    }

    /// Stops the server if running, then starts it again on the same port and config. This
    /// returns before clients notice the restart: a test that wants to see a client reconnect
    /// should `stop`, wait for the client to notice, then `restart`.
    pub fn restart(&mut self) {
        self.stop();
        let mut last_error = String::new();
        for _ in 0..START_ATTEMPTS {
            match self.spawn() {
                Ok(()) => return,
                Err(e) => last_error = e,
            }
            sleep(Duration::from_millis(200));
        }
        panic!("redis-server did not restart: {last_error}");
    }

    /// Runs `redis-cli` against this server (`args` may start with redis-cli options such as
    /// `-n 3`) and returns its trimmed output. Panics if redis-cli fails.
    pub fn cli(&self, args: &[&str]) -> String {
        let mut cmd = Command::new("redis-cli");
        cmd.args(cli_tls(&self.tls))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        if let Some(password) = &self.password {
            cmd.args(["-a", password, "--no-auth-warning"]);
        }
        let out = cmd
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli");
        let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            out.status.success(),
            "redis-cli {args:?} failed: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

/// True when every thread of `pid` is in state `T` (stopped) by /proc.
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.filter_map(Result::ok).all(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            // `tid (comm) state …`: the state follows the last `)`, comm may hold any.
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
        })
    })
}

/// The redis-server arguments of `start_acl`: the `default` user's password, and `user` allowed
/// everything with `password`; none without `acl`.
fn acl_arguments(acl: Option<(&str, &str)>) -> Vec<String> {
    let Some((user, password)) = acl else {
        return Vec::new();
    };
    let acl = [user, "on", &format!(">{password}"), "~*", "&*", "+@all"];
    let mut args = vec![
        "--requirepass",
        ADMIN_PASSWORD,
        "--masterauth",
        ADMIN_PASSWORD,
    ];
    args.push("--user");
    args.extend(acl.iter().map(|a| &**a));
    args.into_iter().map(str::to_owned).collect()
}

/// The ACL user and password `url` names, owned.
fn owned(acl: Option<(&str, &str)>) -> Option<(String, String)> {
    acl.map(|(user, password)| (user.to_owned(), password.to_owned()))
}

/// `extra` as `&str`s, for `start_with`.
fn strs(extra: &[String]) -> Vec<&str> {
    extra.iter().map(String::as_str).collect()
}

/// Percent-encodes everything but RFC 3986's unreserved characters, as a URL's user and
/// password may be written.
pub fn escape(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Up means answering PING, or refusing it for want of a password.
fn answers_ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    let mut reply = [0u8; 64];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read(&mut reply).is_ok_and(|n| {
            let reply = &reply[..n];
            reply.starts_with(b"+PONG") || reply.starts_with(b"-NOAUTH")
        })
}

/// The slot ranges `node` serves, from the `myself` line of its CLUSTER NODES
/// (`… connected 0-5460 7000 [7001->-id]`; the bracketed open slots are not its own yet).
fn own_ranges(node: &RedisServer) -> Vec<std::ops::RangeInclusive<u16>> {
    let nodes = node.cli(&["CLUSTER", "NODES"]);
    let myself = nodes
        .lines()
        .find(|l| l.contains("myself"))
        .expect("CLUSTER NODES lists myself");
    myself
        .split(' ')
        .skip(8)
        .filter_map(|range| {
            let (first, last) = range.split_once('-').unwrap_or((range, range));
            Some(first.parse::<u16>().ok()?..=last.parse::<u16>().ok()?)
        })
        .collect()
}

/// A 3-master Redis Cluster without replicas.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        RedisCluster::start_with(&[])
    }

    /// With extra redis-server arguments for every node, e.g.
    /// `&["--cluster-require-full-coverage", "no"]` (the survivors of a dead master keep
    /// serving their own slots).
    pub fn start_with(extra: &[&str]) -> RedisCluster {
        RedisCluster::launch(extra, None)
    }

    /// Every node TLS-only as by `RedisServer::start_tls` (the same pair on each: it is valid
    /// for 127.0.0.1), the bus and replication too; protected as by `start_acl` when `acl`
    /// names a user and password. `url` is `rediss-cluster://…`.
    pub fn start_tls(tls: &ServerTls, acl: Option<(&str, &str)>) -> RedisCluster {
        RedisCluster::start_as(Some(tls), acl)
    }

    fn start_as(tls: Option<&ServerTls>, acl: Option<(&str, &str)>) -> RedisCluster {
        let mut cluster = RedisCluster::launch(&strs(&acl_arguments(acl)), tls);
        for node in &mut cluster.nodes {
            node.acl_user = owned(acl);
        }
        cluster
    }

    fn launch(extra: &[&str], tls: Option<&ServerTls>) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::launch(extra, true, tls))
            .collect();
        let mut create = Command::new("redis-cli");
        create.args(cli_tls(&nodes[0].tls));
        if let Some(password) = &nodes[0].password {
            create.args(["-a", password, "--no-auth-warning"]);
        }
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let out = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_ok();
        cluster
    }

    /// Every node protected as by `RedisServer::start_acl` (`--masterauth` too), the same ACL
    /// user on each; `url` names it.
    pub fn start_acl(user: &str, password: &str) -> RedisCluster {
        RedisCluster::start_as(None, Some((user, password)))
    }

    /// Waits until every node reports `cluster_state:ok` (a restarted node answers CLUSTERDOWN
    /// for a while after it is back).
    pub fn wait_ok(&self) {
        let deadline = Instant::now() + CLUSTER_READY_WITHIN;
        while !self
            .nodes
            .iter()
            .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
        {
            assert!(
                Instant::now() < deadline,
                "cluster not ok within {CLUSTER_READY_WITHIN:?}"
            );
            sleep(Duration::from_millis(50));
        }
    }

    /// `redis[s]-cluster://[[user]:password@]127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3`
    pub fn url(&self) -> String {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!(
            "{}-cluster://{}{}",
            self.nodes[0].scheme(),
            self.nodes[0].credentials(),
            seeds.join(",")
        )
    }

    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// To stop or restart one node; a restarted node rejoins with its slots (its nodes.conf
    /// survives in its directory).
    pub fn node_mut(&mut self, node: usize) -> &mut RedisServer {
        &mut self.nodes[node]
    }

    pub fn node_id(&self, node: usize) -> String {
        self.nodes[node].cli(&["CLUSTER", "MYID"])
    }

    pub fn slot_of(&self, key: &str) -> u16 {
        let slot = self.nodes[0].cli(&["CLUSTER", "KEYSLOT", key]);
        slot.parse().expect("CLUSTER KEYSLOT answers a number")
    }

    /// The index of the node that serves `slot`, by each node's own account of its slots.
    pub fn owner_of(&self, slot: u16) -> usize {
        self.nodes
            .iter()
            .position(|node| own_ranges(node).iter().any(|r| r.contains(&slot)))
            .unwrap_or_else(|| panic!("no node owns slot {slot}"))
    }

    /// How many slots `node` serves, by its own account.
    pub fn slot_count(&self, node: usize) -> usize {
        own_ranges(&self.nodes[node]).iter().map(|r| r.len()).sum()
    }

    /// Moves `slots` of `from`'s slots to `to` with `redis-cli --cluster reshard`, migrating
    /// `pipeline` keys per MIGRATE (1: a slot's keys move one by one, so each slot is split
    /// between the two masters for a while). Blocks until it is done; its output.
    pub fn reshard(&self, from: usize, to: usize, slots: usize, pipeline: usize) -> String {
        let out = Command::new("redis-cli")
            .args(cli_tls(&self.nodes[0].tls))
            .args(["--cluster", "reshard"])
            .arg(format!("127.0.0.1:{}", self.nodes[to].port))
            .args(["--cluster-from", &self.node_id(from)])
            .args(["--cluster-to", &self.node_id(to)])
            .args(["--cluster-slots", &slots.to_string()])
            .args(["--cluster-pipeline", &pipeline.to_string()])
            .arg("--cluster-yes")
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster reshard");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        // It says what went wrong in `[ERR]` lines on stdout, after one line per slot moved.
        let lines: Vec<&str> = stdout.lines().collect();
        assert!(
            out.status.success() && !stdout.contains("[ERR]"),
            "redis-cli --cluster reshard failed ({}): …\n{}\n{}",
            out.status,
            lines[lines.len().saturating_sub(20)..].join("\n"),
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// Marks `slot` migrating from `from` to `to` and moves all its keys over. Until
    /// `finish_migration`, `from` answers ASK for the slot's keys.
    pub fn start_migration(&self, slot: u16, from: usize, to: usize) {
        self.mark_migrating(slot, from, to);
        let keys = self.nodes[from].cli(&["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100000"]);
        let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
        self.migrate_keys(from, to, &keys);
    }

    /// `CLUSTER SETSLOT … IMPORTING` on `to`, then `… MIGRATING` on `from`: nothing moved yet.
    pub fn mark_migrating(&self, slot: u16, from: usize, to: usize) {
        let slot = slot.to_string();
        let (source, target) = (&self.nodes[from], &self.nodes[to]);
        target.cli(&[
            "CLUSTER",
            "SETSLOT",
            &slot,
            "IMPORTING",
            &self.node_id(from),
        ]);
        source.cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &self.node_id(to)]);
    }

    /// Moves `keys` (all of one slot) from `from` to `to` with one `MIGRATE … KEYS`.
    pub fn migrate_keys(&self, from: usize, to: usize, keys: &[&str]) {
        if keys.is_empty() {
            return;
        }
        let port = self.nodes[to].port.to_string();
        let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000"];
        // The target wants a login too on a protected cluster.
        if let Some(password) = &self.nodes[to].password {
            migrate.extend_from_slice(&["AUTH", password]);
        }
        migrate.push("KEYS");
        migrate.extend_from_slice(keys);
        assert_eq!(self.nodes[from].cli(&migrate), "OK");
    }

    /// Assigns `slot` to `to` on every node, the target first as Redis recommends.
    pub fn finish_migration(&self, slot: u16, to: usize) {
        let slot = slot.to_string();
        let id = self.node_id(to);
        let order = std::iter::once(to).chain((0..self.nodes.len()).filter(|&n| n != to));
        for node in order {
            self.nodes[node].cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &id]);
        }
    }
}

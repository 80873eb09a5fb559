//! The PROXY protocol's header, v1 (text) and v2 (binary), as a load balancer in front of the
//! node sends it first on a connection (HAProxy's `proxy-protocol.txt`): [`parse`] decides one
//! from the bytes read so far (pure, fuzzed), [`read_header`] reads exactly one off a socket.
//!
//! The header is read exactly, never past its end: what follows it is the client's request or
//! its TLS handshake, which the connection's own reader (or rustls) reads next. v2 states its
//! length in its first 16 bytes, so it takes two reads; v1 is a text line that ends at CRLF,
//! read up to the shortest line it could still be, then a byte at a time (a legacy format, read
//! once per connection, from a trusted balancer only).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use monoio::io::AsyncReadRentExt;
use monoio::net::TcpStream;

/// The v2 header's first 12 bytes.
pub const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// The longest v1 line, CRLF included (the protocol's own bound).
pub const V1_MAX: usize = 107;

/// The most a v2 header may carry after its first 16 bytes: the largest address block (a UNIX
/// pair, 216 bytes) and TLVs. Balancers send tens of bytes of TLVs (AWS's VPC endpoint id,
/// SSL, a CRC); 64 KiB would be a slot held for a header nobody needs.
pub const V2_MAX_PAYLOAD: usize = 4096;

/// The shortest header of either version (`PROXY UNKNOWN\r\n`): read before anything is decided.
const SHORTEST: usize = 15;

/// What a complete header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyHeader {
    /// The client's address, or `None` when the header says not to use one (v1 `UNKNOWN`, v2
    /// `LOCAL` — a balancer's own health check — or an address family other than IPv4/IPv6):
    /// the TCP peer stands.
    pub source: Option<SocketAddr>,
    /// The header's length in bytes.
    pub len: usize,
}

/// [`parse`]'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// Not yet decided: at least this many bytes in all are needed.
    Incomplete(usize),
    Complete(ProxyHeader),
}

/// Why bytes are not a PROXY header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyHeaderError {
    /// They start with neither version's signature.
    Missing,
    /// A header, but not one this parser accepts; the reason, for the log.
    Malformed(&'static str),
}

impl std::fmt::Display for ProxyHeaderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProxyHeaderError::Missing => f.write_str("no PROXY protocol header"),
            ProxyHeaderError::Malformed(why) => write!(f, "malformed PROXY protocol header: {why}"),
        }
    }
}

impl std::error::Error for ProxyHeaderError {}

/// Decides a header from the first bytes of a connection (`buf` may hold more after it).
pub fn parse(buf: &[u8]) -> Result<Parsed, ProxyHeaderError> {
    let v1 = b"PROXY ";
    let prefix = buf.len().min(V2_SIGNATURE.len());
    if buf[..prefix] == V2_SIGNATURE[..prefix] && !buf.is_empty() {
        return parse_v2(buf);
    }
    let prefix = buf.len().min(v1.len());
    if buf[..prefix] == v1[..prefix] {
        return parse_v1(buf);
    }
    Err(ProxyHeaderError::Missing)
}

fn parse_v1(buf: &[u8]) -> Result<Parsed, ProxyHeaderError> {
    let malformed = ProxyHeaderError::Malformed;
    let Some(end) = buf.windows(2).take(V1_MAX - 1).position(|w| w == b"\r\n") else {
        if buf.len() >= V1_MAX {
            return Err(malformed("a v1 line longer than 107 bytes"));
        }
        if buf[..buf.len().saturating_sub(1)].contains(&b'\r') {
            return Err(malformed("a CR before the end of a v1 line"));
        }
        return Ok(Parsed::Incomplete(buf.len().max(SHORTEST - 1) + 1));
    };
    let line = std::str::from_utf8(&buf[6..end]).map_err(|_| malformed("a v1 line not ASCII"))?;
    if line.contains('\r') {
        return Err(malformed("a CR before the end of a v1 line"));
    }
    let len = end + 2;
    let mut fields = line.split(' ');
    let family = fields.next().unwrap_or_default();
    if family == "UNKNOWN" {
        // The receiver ignores the rest of the line and uses the connection's own addresses.
        return Ok(Parsed::Complete(ProxyHeader { source: None, len }));
    }
    let fields: Vec<&str> = fields.collect();
    let [source, _destination, source_port, destination_port] = fields[..] else {
        return Err(malformed("a v1 line without 4 fields after its family"));
    };
    let ip: IpAddr = match family {
        "TCP4" => source
            .parse::<Ipv4Addr>()
            .map_err(|_| malformed("a v1 TCP4 source that is no IPv4 address"))?
            .into(),
        "TCP6" => source
            .parse::<Ipv6Addr>()
            .map_err(|_| malformed("a v1 TCP6 source that is no IPv6 address"))?
            .into(),
        _ => return Err(malformed("a v1 family other than TCP4, TCP6 or UNKNOWN")),
    };
    let (Some(port), Some(_)) = (port(source_port), port(destination_port)) else {
        return Err(malformed("a v1 port that is not 0 to 65535"));
    };
    Ok(Parsed::Complete(ProxyHeader {
        source: Some(SocketAddr::new(ip, port)),
        len,
    }))
}

/// A decimal port: digits only, no sign, no leading zero.
fn port(text: &str) -> Option<u16> {
    let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    (digits && (text == "0" || !text.starts_with('0')) && text.len() <= 5)
        .then(|| text.parse().ok())
        .flatten()
}

fn parse_v2(buf: &[u8]) -> Result<Parsed, ProxyHeaderError> {
    let malformed = ProxyHeaderError::Malformed;
    if buf.len() < 16 {
        return Ok(Parsed::Incomplete(16));
    }
    let (version, command) = (buf[12] >> 4, buf[12] & 0x0f);
    if version != 2 {
        return Err(malformed("a v2 header whose version is not 2"));
    }
    let (family, transport) = (buf[13] >> 4, buf[13] & 0x0f);
    let payload = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if payload > V2_MAX_PAYLOAD {
        return Err(malformed(
            "a v2 header longer than 4096 bytes after its first 16",
        ));
    }
    let len = 16 + payload;
    if buf.len() < len {
        return Ok(Parsed::Incomplete(len));
    }
    let body = &buf[16..len];
    let addresses = match family {
        0 => 0,
        1 => 12,
        2 => 36,
        3 => 216,
        _ => return Err(malformed("a v2 address family above UNIX")),
    };
    if payload < addresses {
        return Err(malformed("a v2 header shorter than its addresses"));
    }
    tlvs(&body[addresses..])?;
    let source = match command {
        // LOCAL: the balancer's own connection (a health check); whatever it says is ignored.
        0 => None,
        1 => {
            if family != 0 && transport != 1 {
                return Err(malformed(
                    "a v2 PROXY command over a transport other than STREAM",
                ));
            }
            match family {
                1 => {
                    let ip = Ipv4Addr::from(<[u8; 4]>::try_from(&body[0..4]).unwrap());
                    Some(SocketAddr::new(
                        ip.into(),
                        u16::from_be_bytes([body[8], body[9]]),
                    ))
                }
                2 => {
                    let ip = Ipv6Addr::from(<[u8; 16]>::try_from(&body[0..16]).unwrap());
                    Some(SocketAddr::new(
                        ip.into(),
                        u16::from_be_bytes([body[32], body[33]]),
                    ))
                }
                // UNSPEC or UNIX: no address the node could use; the connection's own stands.
                _ => None,
            }
        }
        _ => return Err(malformed("a v2 command other than LOCAL or PROXY")),
    };
    Ok(Parsed::Complete(ProxyHeader { source, len }))
}

/// The TLVs after the addresses: each a type, a 2-byte length and that many bytes, ending
/// exactly at the header's end. Their contents are not used.
fn tlvs(mut rest: &[u8]) -> Result<(), ProxyHeaderError> {
    while !rest.is_empty() {
        if rest.len() < 3 {
            return Err(ProxyHeaderError::Malformed("a truncated v2 TLV"));
        }
        let len = usize::from(u16::from_be_bytes([rest[1], rest[2]]));
        rest = rest.get(3 + len..).ok_or(ProxyHeaderError::Malformed(
            "a v2 TLV longer than the header",
        ))?;
    }
    Ok(())
}

/// Why a header could not be read off a connection.
#[derive(Debug)]
pub enum ReadError {
    Header(ProxyHeaderError),
    Io(std::io::Error),
    TimedOut,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Header(e) => e.fmt(f),
            ReadError::Io(e) => write!(f, "reading the PROXY protocol header: {e}"),
            ReadError::TimedOut => f.write_str("no whole PROXY protocol header in time"),
        }
    }
}

/// Reads exactly one header off `stream` within `within`; nothing after it is consumed.
pub async fn read_header(
    stream: &mut TcpStream,
    within: Duration,
) -> Result<ProxyHeader, ReadError> {
    let read = async {
        let mut buf = Vec::with_capacity(64);
        let mut want = SHORTEST;
        loop {
            let have = buf.len();
            let (res, more) = stream.read_exact(vec![0u8; want - have]).await;
            res.map_err(ReadError::Io)?;
            buf.extend_from_slice(&more);
            match parse(&buf).map_err(ReadError::Header)? {
                Parsed::Complete(header) => return Ok(header),
                Parsed::Incomplete(needed) => want = needed,
            }
        }
    };
    monoio::time::timeout(within, read)
        .await
        .unwrap_or(Err(ReadError::TimedOut))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn complete(buf: &[u8]) -> ProxyHeader {
        match parse(buf) {
            Ok(Parsed::Complete(header)) => header,
            other => panic!("{other:?} for {buf:?}"),
        }
    }

    fn malformed(buf: &[u8]) -> &'static str {
        match parse(buf) {
            Err(ProxyHeaderError::Malformed(why)) => why,
            other => panic!("{other:?} for {buf:?}"),
        }
    }

    fn v2(command: u8, family: u8, payload: &[u8]) -> Vec<u8> {
        let mut header = V2_SIGNATURE.to_vec();
        header.extend([0x20 | command, family]);
        header.extend((payload.len() as u16).to_be_bytes());
        header.extend(payload);
        header
    }

    #[test]
    fn v1_gives_the_source_and_its_exact_length() {
        let line = b"PROXY TCP4 203.0.113.7 10.0.0.1 51234 443\r\nGET / HTTP/1.1\r\n";
        let header = complete(line);
        assert_eq!(header.source, Some("203.0.113.7:51234".parse().unwrap()));
        assert_eq!(&line[header.len..header.len + 3], b"GET");
        let six = complete(b"PROXY TCP6 2001:db8::7 2001:db8::1 1 65535\r\n");
        assert_eq!(six.source, Some("[2001:db8::7]:1".parse().unwrap()));
        let unknown = complete(b"PROXY UNKNOWN ffff:f...f:ffff 1 2\r\n");
        assert_eq!(unknown.source, None);
        assert_eq!(complete(b"PROXY UNKNOWN\r\n").len, 15);
    }

    #[test]
    fn v1_refuses_what_the_protocol_does_not_allow() {
        assert!(malformed(b"PROXY TCP4 203.0.113.7 10.0.0.1 51234\r\n").contains("4 fields"));
        assert!(malformed(b"PROXY TCP4 2001:db8::7 10.0.0.1 1 2\r\n").contains("IPv4"));
        assert!(malformed(b"PROXY TCP6 203.0.113.7 ::1 1 2\r\n").contains("IPv6"));
        assert!(malformed(b"PROXY TCP4 1.2.3.4 1.2.3.4 65536 2\r\n").contains("port"));
        assert!(malformed(b"PROXY TCP4 1.2.3.4 1.2.3.4 -1 2\r\n").contains("port"));
        assert!(malformed(b"PROXY TCP4 1.2.3.4 1.2.3.4 080 2\r\n").contains("port"));
        assert!(malformed(b"PROXY TCP4  1.2.3.4 1.2.3.4 1 2\r\n").contains("fields"));
        assert!(malformed(b"PROXY UDP4 1.2.3.4 1.2.3.4 1 2\r\n").contains("family"));
        assert!(malformed(b"PROXY TCP4 1.2.3.4\r1.2.3.4 1 2\r\n").contains("CR"));
        let long = [b"PROXY TCP4 ".as_slice(), &[b'1'; 120]].concat();
        assert!(malformed(&long).contains("107"));
    }

    #[test]
    fn a_partial_header_asks_for_no_more_than_it_can_take() {
        assert_eq!(parse(b""), Ok(Parsed::Incomplete(SHORTEST)));
        assert_eq!(parse(b"PROX"), Ok(Parsed::Incomplete(SHORTEST)));
        assert_eq!(parse(b"PROXY TCP4 1.2.3"), Ok(Parsed::Incomplete(17)));
        assert_eq!(parse(b"\r\n\r\n\0"), Ok(Parsed::Incomplete(16)));
        let whole = v2(1, 0x11, &[1, 2, 3, 4, 5, 6, 7, 8, 0, 80, 1, 187]);
        assert_eq!(parse(&whole[..16]), Ok(Parsed::Incomplete(28)));
        // Every prefix of a valid header asks for at most the header's length: the reader
        // never consumes a byte of what follows it.
        for header in [
            whole.as_slice(),
            b"PROXY TCP6 ::1 ::1 1 2\r\n",
            b"PROXY UNKNOWN\r\n",
        ] {
            for cut in 0..header.len() {
                match parse(&header[..cut]) {
                    Ok(Parsed::Incomplete(n)) => assert!(n > cut && n <= header.len(), "{cut}"),
                    other => panic!("{other:?} at {cut}"),
                }
            }
        }
    }

    #[test]
    fn v2_gives_the_source_and_skips_its_tlvs() {
        let mut payload = vec![203, 0, 113, 7, 10, 0, 0, 1, 0xc8, 0x22, 1, 187];
        payload.extend([0x04, 0, 2, 0xab, 0xcd]); // a NOOP TLV
        let header = complete(&v2(1, 0x11, &payload));
        assert_eq!(header.source, Some("203.0.113.7:51234".parse().unwrap()));
        assert_eq!(header.len, 16 + payload.len());
        let mut six = [0u8; 36];
        six[15] = 1;
        six[32..34].copy_from_slice(&443u16.to_be_bytes());
        assert_eq!(
            complete(&v2(1, 0x21, &six)).source,
            Some("[::1]:443".parse().unwrap())
        );
        // LOCAL (a health check) and UNSPEC/UNIX: the connection's own address stands.
        assert_eq!(complete(&v2(0, 0x00, &[])).source, None);
        assert_eq!(complete(&v2(0, 0x11, &payload)).source, None);
        assert_eq!(complete(&v2(1, 0x31, &[0; 216])).source, None);
    }

    #[test]
    fn v2_refuses_what_the_protocol_does_not_allow() {
        let four = [1, 2, 3, 4, 5, 6, 7, 8, 0, 80, 0, 80];
        let mut wrong_version = v2(1, 0x11, &four);
        wrong_version[12] = 0x11;
        assert!(malformed(&wrong_version).contains("version"));
        assert!(malformed(&v2(2, 0x11, &four)).contains("command"));
        assert!(malformed(&v2(1, 0x12, &four)).contains("STREAM"));
        assert!(malformed(&v2(1, 0x41, &four)).contains("family"));
        assert!(malformed(&v2(1, 0x11, &four[..8])).contains("addresses"));
        assert!(malformed(&v2(1, 0x21, &four)).contains("addresses"));
        let truncated = [four.as_slice(), &[0x04, 0]].concat();
        assert!(malformed(&v2(1, 0x11, &truncated)).contains("truncated"));
        let overlong = [four.as_slice(), &[0x04, 0, 9, 1]].concat();
        assert!(malformed(&v2(1, 0x11, &overlong)).contains("TLV longer"));
        let mut huge = v2(1, 0x11, &four);
        huge[14..16].copy_from_slice(&5000u16.to_be_bytes());
        assert!(malformed(&huge).contains("4096"));
    }

    #[test]
    fn http_and_tls_are_no_header() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Err(ProxyHeaderError::Missing));
        assert_eq!(parse(&[0x16, 3, 1, 0, 200]), Err(ProxyHeaderError::Missing));
        assert_eq!(parse(b"PROXZ"), Err(ProxyHeaderError::Missing));
    }
}

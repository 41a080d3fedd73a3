//! `tandem health`: asks a running server's `/health` and exits 0 only when it answers 200.
//!
//! Why it exists: a container's health check runs a command inside the image, and tandem's
//! runtime image carries no HTTP client. Plain HTTP/1.1 over a blocking socket is all it takes.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use clap::Args;

use super::CliError;

#[derive(Args)]
pub struct HealthArgs {
    /// The URL to ask, http only [default: /health on 127.0.0.1 at --port].
    #[arg(long)]
    url: Option<String>,
    /// The server's port (default: the config's server.port), as `tandem serve --port`.
    #[arg(long, env = "TANDEM_PORT")]
    port: Option<u16>,
    /// Seconds to wait for the connection and the answer.
    #[arg(long, default_value_t = 5)]
    timeout: u64,
}

/// An `http://host:port/path` URL split into the address and the path.
fn split_url(url: &str) -> Result<(String, String), CliError> {
    let bad = |reason: &str| CliError::Flag {
        flag: "--url",
        reason: format!("{reason} (got {url:?}; expected http://HOST:PORT/PATH)"),
    };
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| bad("must start with http://"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/health"),
    };
    if authority.is_empty() {
        return Err(bad("has no host"));
    }
    let addr = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    Ok((addr, path.to_string()))
}

/// The status code of `GET url`.
fn status_of(addr: &str, path: &str, timeout: Duration) -> Result<u16, std::io::Error> {
    let target = addr.to_socket_addrs()?.next().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{addr} resolves to nothing"),
        )
    })?;
    let mut stream = TcpStream::connect_timeout(&target, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut head = [0u8; 64];
    let mut len = 0;
    while len < head.len() {
        let n = stream.read(&mut head[len..])?;
        if n == 0 {
            break;
        }
        len += n;
        if head[..len].contains(&b'\n') {
            break;
        }
    }
    let line = String::from_utf8_lossy(&head[..len]);
    line.split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("not an HTTP answer: {line:?}"),
            )
        })
}

pub fn run(port: u16, args: HealthArgs) -> Result<(), CliError> {
    let url = args
        .url
        .unwrap_or_else(|| format!("http://127.0.0.1:{}/health", args.port.unwrap_or(port)));
    let (addr, path) = split_url(&url)?;
    match status_of(&addr, &path, Duration::from_secs(args.timeout.max(1))) {
        Ok(200) => {
            println!("{url}: 200");
            Ok(())
        }
        Ok(code) => Err(CliError::Unhealthy {
            url,
            reason: format!("answered {code}"),
        }),
        Err(e) => Err(CliError::Unhealthy {
            url,
            reason: e.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_address_and_path() {
        let (a, p) = split_url("http://127.0.0.1:8080/health").unwrap();
        assert_eq!((a.as_str(), p.as_str()), ("127.0.0.1:8080", "/health"));
        let (a, p) = split_url("http://localhost:9000").unwrap();
        assert_eq!((a.as_str(), p.as_str()), ("localhost:9000", "/health"));
        let (a, _) = split_url("http://example/x").unwrap();
        assert_eq!(a, "example:80");
        let (a, _) = split_url("http://[::1]:8080/health").unwrap();
        assert_eq!(a, "[::1]:8080");
        assert!(split_url("https://x/health").is_err());
        assert!(split_url("http:///health").is_err());
    }
}

//! Content negotiation for `/files`: which encoding a download gets from `Accept-Encoding`
//! (RFC 7231 with q-values; identity is acceptable unless refused with `q=0`), and the media
//! type named by a file's extension.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Identity,
    Gzip,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    pub encoding: Encoding,
    pub identity_rejected: bool,
}

/// The best supported encoding, or `Err` (406) when only unsupported ones are acceptable.
pub fn accept_encoding(header: Option<&str>) -> Result<Negotiated, String> {
    let Some(h) = header.filter(|h| !h.trim().is_empty()) else {
        return Ok(Negotiated {
            encoding: Encoding::Identity,
            identity_rejected: false,
        });
    };
    let mut items: Vec<(String, f64)> = h
        .split(',')
        .map(|item| {
            let mut parts = item.split(';');
            let name = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let q = parts
                .filter_map(|p| {
                    let p = p.trim();
                    p.strip_prefix("q=")
                        .or_else(|| p.strip_prefix("Q="))
                        .and_then(|v| v.trim().parse::<f64>().ok())
                })
                .next()
                .unwrap_or(1.0);
            (name, q)
        })
        .filter(|(n, _)| !n.is_empty())
        .collect();
    // Highest preference first; equal preferences keep their order.
    items.sort_by(|a, b| b.1.partial_cmp(&a.1).unwrap_or(std::cmp::Ordering::Equal));
    let identity_rejected = items.iter().any(|(n, q)| n == "identity" && *q == 0.0)
        || (items.iter().any(|(n, q)| n == "*" && *q == 0.0)
            && !items.iter().any(|(n, q)| n == "identity" && *q > 0.0));
    for (name, q) in &items {
        if *q == 0.0 {
            continue;
        }
        match name.as_str() {
            "identity" => {
                return Ok(Negotiated {
                    encoding: Encoding::Identity,
                    identity_rejected,
                });
            }
            "gzip" | "x-gzip" => {
                return Ok(Negotiated {
                    encoding: Encoding::Gzip,
                    identity_rejected,
                });
            }
            "*" => {
                let encoding = if identity_rejected {
                    Encoding::Gzip
                } else {
                    Encoding::Identity
                };
                return Ok(Negotiated {
                    encoding,
                    identity_rejected,
                });
            }
            _ => {}
        }
    }
    if identity_rejected {
        return Err(format!(
            "no acceptable encoding found in '{h}', supported: [gzip]"
        ));
    }
    Ok(Negotiated {
        encoding: Encoding::Identity,
        identity_rejected,
    })
}

/// The media type of a download by its extension, as Go's `mime.TypeByExtension` knows the
/// common ones; anything else is `application/octet-stream`.
pub fn content_type_for(name: &str) -> &'static str {
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "txt" | "log" | "md" => "text/plain; charset=utf-8",
        "html" | "htm" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "csv" => "text/csv; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "json" => "application/json",
        "xml" => "text/xml; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "tar" => "application/x-tar",
        "wasm" => "application/wasm",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(h: &str) -> Result<Encoding, String> {
        accept_encoding(Some(h)).map(|n| n.encoding)
    }

    #[test]
    fn negotiates_like_envd() {
        assert_eq!(accept_encoding(None).unwrap().encoding, Encoding::Identity);
        assert_eq!(enc("gzip"), Ok(Encoding::Gzip));
        assert_eq!(enc("br, gzip;q=0.5"), Ok(Encoding::Gzip));
        assert_eq!(enc("gzip;q=0.5, identity"), Ok(Encoding::Identity));
        assert_eq!(enc("zstd,gzip,br"), Ok(Encoding::Gzip));
        assert_eq!(
            enc("br"),
            Ok(Encoding::Identity),
            "identity stays acceptable"
        );
        assert!(enc("br, identity;q=0").is_err());
        assert!(enc("br, *;q=0").is_err());
        assert_eq!(enc("*"), Ok(Encoding::Identity));
        assert_eq!(enc("identity;q=0, *"), Ok(Encoding::Gzip));
        assert!(
            accept_encoding(Some("gzip; q=1,*; q=0"))
                .unwrap()
                .identity_rejected
        );
    }

    #[test]
    fn media_types() {
        assert_eq!(content_type_for("a.txt"), "text/plain; charset=utf-8");
        assert_eq!(content_type_for("A.PNG"), "image/png");
        assert_eq!(content_type_for("noext"), "application/octet-stream");
    }
}

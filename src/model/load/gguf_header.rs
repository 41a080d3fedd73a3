//! A GGUF file's header values that the reader beneath (candle's `gguf_file`) trusts, checked
//! first, so a malformed file is an error naming its key, never a panic.
//!
//! Why it exists: candle divides by `general.alignment` as the file gives it; a file saying 0
//! panicked the loader. The metadata is walked here (bounded by the file's own size) and each
//! value the reader relies on is checked; [`read_content`] also turns any panic left in the
//! reader into an error.

use std::io::{Read, Seek, SeekFrom};
use std::panic::{catch_unwind, AssertUnwindSafe};

use candle_core::quantized::gguf_file;

use crate::model::load::mxfp4::{Mxfp4Tensor, Mxfp4Tensors, GGML_TYPE_MXFP4};

/// GGUF metadata value types (the GGUF spec's numbering).
const STRING: u32 = 8;
const ARRAY: u32 = 9;
/// Arrays nested deeper than this are refused (the spec's files nest none).
const MAX_NESTING: usize = 4;

/// Why a header is refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum HeaderError {
    #[error("{0}")]
    Malformed(String),
    #[error("{key} is {value}: {why}")]
    BadValue {
        key: &'static str,
        value: String,
        why: &'static str,
    },
}

/// Reads the metadata of a GGUF file (after its magic) and checks the values the reader trusts.
pub fn check_header<R: Read>(r: &mut R, file_len: u64) -> Result<(), HeaderError> {
    let mut w = Walker { r, left: file_len };
    let magic = w.bytes(4)?;
    if magic != b"GGUF" {
        // Not ours to judge: the reader names the wrong magic itself.
        return Ok(());
    }
    let version = w.u32()?;
    let (tensors, kvs) = if version == 1 {
        (w.u32()? as u64, w.u32()? as u64)
    } else {
        (w.u64()?, w.u64()?)
    };
    let _ = tensors;
    for _ in 0..kvs {
        let key = w.string(version)?;
        let ty = w.u32()?;
        if key == "general.alignment" {
            let value = w.scalar(ty)?;
            return check_alignment(ty, value);
        }
        w.skip_value(ty, version, 0)?;
    }
    Ok(())
}

fn check_alignment(ty: u32, value: Option<u64>) -> Result<(), HeaderError> {
    let Some(v) = value else {
        return Err(HeaderError::BadValue {
            key: "general.alignment",
            value: format!("of type {ty}"),
            why: "it must be an unsigned integer (uint32)",
        });
    };
    if v == 0 || !v.is_power_of_two() {
        return Err(HeaderError::BadValue {
            key: "general.alignment",
            value: v.to_string(),
            why: "it must be a power of two (llama.cpp writes 32)",
        });
    }
    Ok(())
}

/// Reads candle's view of the file from its start, turning a panic inside the reader into an
/// error, and its MXFP4 tensors apart: candle refuses a type it does not know, so the header
/// it reads is a copy with their type changed, and their entries are taken out of its view
/// (each named once: in the view, or among the MXFP4 tensors).
pub fn read_content<R: Read + Seek>(
    r: &mut R,
) -> Result<(gguf_file::Content, Mxfp4Tensors), String> {
    let file_len = r.seek(SeekFrom::End(0)).map_err(|e| e.to_string())?;
    r.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    let found =
        find_mxfp4(&mut std::io::BufReader::new(&mut *r), file_len).map_err(|e| e.to_string())?;
    r.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    let Some(found) = found.filter(|f| !f.tensors.is_empty()) else {
        return Ok((read_candle(r)?, Mxfp4Tensors::new()));
    };
    let mut header = vec![0u8; found.header_len as usize];
    r.read_exact(&mut header).map_err(|e| e.to_string())?;
    for (_, _, type_at) in &found.tensors {
        // Q8_0: any type candle knows; the entry leaves its view below.
        header[*type_at as usize..][..4].copy_from_slice(&8u32.to_le_bytes());
    }
    let mut content = read_candle(&mut std::io::Cursor::new(header))?;
    let mut mxfp4 = Mxfp4Tensors::new();
    for (name, tensor, _) in found.tensors {
        content.tensor_infos.remove(&name);
        mxfp4.insert(name, tensor);
    }
    Ok((content, mxfp4))
}

/// The MXFP4 tensors of a header and where its type fields are, and the header's length.
struct Found {
    header_len: u64,
    tensors: Vec<(String, Mxfp4Tensor, u64)>,
}

/// Walks the header to its tensor entries and lists the MXFP4 ones (`None` for a file that
/// is no GGUF: candle's reader says why).
fn find_mxfp4<R: Read>(r: &mut R, file_len: u64) -> Result<Option<Found>, HeaderError> {
    let mut w = Walker { r, left: file_len };
    if w.bytes(4)? != b"GGUF" {
        return Ok(None);
    }
    let version = w.u32()?;
    let count = |w: &mut Walker<R>| match version {
        1 => w.u32().map(u64::from),
        _ => w.u64(),
    };
    let (tensors, kvs) = (count(&mut w)?, count(&mut w)?);
    for _ in 0..kvs {
        w.string(version)?;
        let ty = w.u32()?;
        w.skip_value(ty, version, 0)?;
    }
    let mut found = Vec::new();
    for _ in 0..tensors {
        let name = w.string(version)?;
        let n_dims = w.u32()?;
        if n_dims > 4 {
            return Err(HeaderError::Malformed(format!(
                "tensor {name} has {n_dims} dimensions"
            )));
        }
        let mut dims = (0..n_dims)
            .map(|_| count(&mut w).map(|d| d as usize))
            .collect::<Result<Vec<_>, _>>()?;
        let type_at = file_len - w.left;
        let ty = w.u32()?;
        let offset = w.u64()?;
        if ty == GGML_TYPE_MXFP4 {
            dims.reverse();
            found.push((name, Mxfp4Tensor { dims, offset }, type_at));
        }
    }
    Ok(Some(Found {
        header_len: file_len - w.left,
        tensors: found,
    }))
}

/// candle's reader, a panic inside it turned into an error.
fn read_candle<R: Read + Seek>(r: &mut R) -> Result<gguf_file::Content, String> {
    match catch_unwind(AssertUnwindSafe(|| gguf_file::Content::read(r))) {
        Ok(Ok(content)) => Ok(content),
        Ok(Err(e)) => Err(e.to_string()),
        Err(panic) => Err(format!(
            "the GGUF reader failed on the header ({})",
            panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default()
        )),
    }
}

/// Reads through metadata without keeping it, never past the file's length.
struct Walker<'a, R> {
    r: &'a mut R,
    left: u64,
}

impl<R: Read> Walker<'_, R> {
    fn bytes(&mut self, n: u64) -> Result<Vec<u8>, HeaderError> {
        if n > self.left {
            return Err(HeaderError::Malformed(format!(
                "the header claims {n} bytes where the file has {} left",
                self.left
            )));
        }
        self.left -= n;
        let mut buf = vec![0; n as usize];
        self.r
            .read_exact(&mut buf)
            .map_err(|e| HeaderError::Malformed(e.to_string()))?;
        Ok(buf)
    }

    fn u32(&mut self) -> Result<u32, HeaderError> {
        Ok(u32::from_le_bytes(
            self.bytes(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, HeaderError> {
        Ok(u64::from_le_bytes(
            self.bytes(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn string(&mut self, version: u32) -> Result<String, HeaderError> {
        let len = if version == 1 {
            self.u32()? as u64
        } else {
            self.u64()?
        };
        Ok(String::from_utf8_lossy(&self.bytes(len)?).into_owned())
    }

    /// An unsigned integer value of type `ty` (negative signed ones as `None`), or `None`
    /// for any other type (consumed all the same).
    fn scalar(&mut self, ty: u32) -> Result<Option<u64>, HeaderError> {
        Ok(match ty {
            0 => Some(self.bytes(1)?[0] as u64),
            1 => Some(self.bytes(1)?[0] as i8).and_then(|v| u64::try_from(v).ok()),
            2 => Some(u16::from_le_bytes(self.bytes(2)?.try_into().expect("2")) as u64),
            3 => u64::try_from(i16::from_le_bytes(self.bytes(2)?.try_into().expect("2"))).ok(),
            4 => Some(self.u32()? as u64),
            5 => u64::try_from(self.u32()? as i32).ok(),
            10 => Some(self.u64()?),
            11 => u64::try_from(self.u64()? as i64).ok(),
            other => {
                self.skip_value(other, 3, 0)?;
                None
            }
        })
    }

    fn skip_value(&mut self, ty: u32, version: u32, depth: usize) -> Result<(), HeaderError> {
        match ty {
            0 | 1 | 7 => self.skip(1),
            2 | 3 => self.skip(2),
            4..=6 => self.skip(4),
            10..=12 => self.skip(8),
            STRING => self.string(version).map(|_| ()),
            ARRAY if depth < MAX_NESTING => {
                let elem = self.u32()?;
                let n = if version == 1 {
                    self.u32()? as u64
                } else {
                    self.u64()?
                };
                if let Some(size) = fixed_size(elem) {
                    let total = n.checked_mul(size).ok_or_else(|| {
                        HeaderError::Malformed(format!("an array of {n} values overflows"))
                    })?;
                    return self.skip(total);
                }
                for _ in 0..n {
                    self.skip_value(elem, version, depth + 1)?;
                }
                Ok(())
            }
            ARRAY => Err(HeaderError::Malformed("arrays nested too deep".into())),
            other => Err(HeaderError::Malformed(format!(
                "a metadata value of unknown type {other}"
            ))),
        }
    }

    fn skip(&mut self, n: u64) -> Result<(), HeaderError> {
        if n > self.left {
            return Err(HeaderError::Malformed(format!(
                "the header claims {n} bytes where the file has {} left",
                self.left
            )));
        }
        self.left -= n;
        std::io::copy(&mut self.r.by_ref().take(n), &mut std::io::sink())
            .map_err(|e| HeaderError::Malformed(e.to_string()))?;
        Ok(())
    }
}

fn fixed_size(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF v3 header with the given key-value pairs (each value already encoded with its
    /// type) and no tensors.
    fn header(kvs: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend((kvs.len() as u64).to_le_bytes());
        for (k, ty, v) in kvs {
            b.extend((k.len() as u64).to_le_bytes());
            b.extend(k.as_bytes());
            b.extend(ty.to_le_bytes());
            b.extend(v);
        }
        b
    }

    fn string_value(s: &str) -> Vec<u8> {
        let mut v = (s.len() as u64).to_le_bytes().to_vec();
        v.extend(s.as_bytes());
        v
    }

    fn check(bytes: &[u8]) -> Result<(), HeaderError> {
        check_header(&mut &bytes[..], bytes.len() as u64)
    }

    #[test]
    fn alignment_zero_or_not_a_power_of_two_is_refused_by_name() {
        let name = ("general.name", STRING, string_value("x"));
        for bad in [0u32, 3, 48] {
            let file = header(&[
                name.clone(),
                ("general.alignment", 4, bad.to_le_bytes().to_vec()),
            ]);
            let e = check(&file).unwrap_err().to_string();
            assert!(
                e.contains("general.alignment") && e.contains(&bad.to_string()),
                "{e}"
            );
            // And candle's reader, which divides by it, no longer panics past it.
            let read = read_content(&mut std::io::Cursor::new(&file)).map(|(c, _)| c);
            if bad == 0 {
                assert!(read.unwrap_err().contains("GGUF reader failed"));
            }
        }
        let text = header(&[("general.alignment", STRING, string_value("32"))]);
        assert!(check(&text)
            .unwrap_err()
            .to_string()
            .contains("unsigned integer"));
        for good in [1u32, 32, 64] {
            let file = header(&[
                ("tokenizer.ggml.tokens", ARRAY, {
                    let mut v = STRING.to_le_bytes().to_vec();
                    v.extend(2u64.to_le_bytes());
                    v.extend(string_value("a"));
                    v.extend(string_value("bc"));
                    v
                }),
                ("general.alignment", 4, good.to_le_bytes().to_vec()),
            ]);
            assert_eq!(check(&file), Ok(()), "{good}");
        }
    }

    #[test]
    fn lengths_past_the_file_are_refused_without_allocating_them() {
        let mut file = header(&[("general.name", STRING, string_value("x"))]);
        // The string's length claims an exabyte.
        let at = 4 + 4 + 8 + 8 + 8 + "general.name".len() + 4;
        file[at..at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(matches!(check(&file), Err(HeaderError::Malformed(_))));
        let arr = header(&[("a", ARRAY, {
            let mut v = 4u32.to_le_bytes().to_vec();
            v.extend(u64::MAX.to_le_bytes());
            v
        })]);
        assert!(matches!(check(&arr), Err(HeaderError::Malformed(_))));
    }
}

//! `NUVEC_ALIGNED_CACHE`'s copies (nuvec::io::align_safetensors, open_through_cache): a
//! safetensors file whose tensors sit at odd offsets (as mlx-community's unpadded headers put
//! them) is copied once with every tensor at a 256-byte boundary, its values and metadata
//! unchanged and the gap fillers not listed; the next open maps that copy without writing it
//! again; a changed source gets a new copy (never the stale one); an aligned source is used in
//! place with nothing written; a cache that cannot be written is an error naming the knob, with the
//! source untouched.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use nuvec::io::{open_through_cache, save_safetensors, SafetensorsFile, ALIGNMENT};
use nuvec::{Array, DType};

/// A folder of this test's own, removed when it ends.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("nuvec-aligned-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A safetensors file written by hand: f32, u8, bf16 and u32 tensors back to back after a header
/// padded so that the data starts at an offset of 1 mod 4 (every 4-byte tensor misaligned).
fn misaligned(path: &Path, seed: u8) {
    let a: Vec<u8> = [1.5f32, -2.0, seed as f32].iter().flat_map(|v| v.to_le_bytes()).collect();
    let b: Vec<u8> = (0..5).map(|i| seed.wrapping_add(i)).collect();
    let c: Vec<u8> = (0..6u16).flat_map(|i| (0x3f80u16 + i + seed as u16).to_le_bytes()).collect();
    let d: Vec<u8> = (0..4u32).flat_map(|i| (i * 1000 + seed as u32).to_le_bytes()).collect();
    let (la, lb, lc, ld) = (a.len(), b.len(), c.len(), d.len());
    let mut json = serde_json::json!({
        "__metadata__": {"format": "mlx"},
        "a": {"dtype": "F32", "shape": [3], "data_offsets": [0, la]},
        "b": {"dtype": "U8", "shape": [5], "data_offsets": [la, la + lb]},
        "c": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [la + lb, la + lb + lc]},
        "d": {"dtype": "U32", "shape": [4], "data_offsets": [la + lb + lc, la + lb + lc + ld]},
    })
    .to_string()
    .into_bytes();
    while (8 + json.len()) % 4 != 1 {
        json.push(b' ');
    }
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend(json);
    for part in [a, b, c, d] {
        bytes.extend(part);
    }
    fs::write(path, bytes).unwrap();
}

/// Every tensor's dtype, shape and bytes (each also taken as an array, which must load).
fn contents(file: &SafetensorsFile) -> HashMap<String, (DType, Vec<usize>, Vec<u8>)> {
    file.tensors()
        .iter()
        .map(|(name, t)| {
            let a: Array = file.array(name).unwrap();
            assert_eq!((a.dtype(), a.shape(), a.nbytes()), (t.dtype, &t.shape[..], t.len()));
            (name.clone(), (t.dtype, t.shape.clone(), file.bytes()[t.offset()..t.offset() + t.len()].to_vec()))
        })
        .collect()
}

fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir).map(|r| r.map(|e| e.unwrap().path()).collect()).unwrap_or_default();
    v.sort();
    v
}

#[test]
fn a_misaligned_file_is_copied_once_aligned_and_mapped_from_then_on() {
    let dir = Scratch::new("copy");
    let (src, cache) = (dir.0.join("model.safetensors"), dir.0.join("aligned"));
    misaligned(&src, 7);
    let original = SafetensorsFile::open(&src).unwrap();
    assert!(!original.aligned(), "the fixture must be misaligned");
    // Taken now: rewriting the source below changes what its map shows.
    let first = contents(&original);
    let source_bytes = fs::read(&src).unwrap();

    let copy = open_through_cache(&src, Some(&cache)).unwrap();
    assert!(copy.path().starts_with(&cache), "{}", copy.path().display());
    assert!(copy.aligned());
    for (name, t) in copy.tensors() {
        assert_eq!(t.offset() % ALIGNMENT, 0, "{name} at {}", t.offset());
    }
    assert_eq!(contents(&copy), first, "values, dtypes and shapes unchanged; no gap tensors listed");
    assert_eq!(copy.metadata(), original.metadata());
    assert_eq!(fs::read(&src).unwrap(), source_bytes, "the source was written");
    assert_eq!(files_in(&cache), vec![copy.path().to_path_buf()], "one copy, no partial file left");

    // Opened again: the same copy, not written again.
    let written = fs::metadata(copy.path()).unwrap().modified().unwrap();
    let again = open_through_cache(&src, Some(&cache)).unwrap();
    assert_eq!(again.path(), copy.path());
    assert_eq!(fs::metadata(copy.path()).unwrap().modified().unwrap(), written);

    // A changed source (other values, a later modification time): a new copy with its values.
    std::thread::sleep(std::time::Duration::from_millis(20));
    misaligned(&src, 9);
    let changed = SafetensorsFile::open(&src).unwrap();
    let fresh = open_through_cache(&src, Some(&cache)).unwrap();
    assert_ne!(fresh.path(), copy.path());
    assert_eq!(contents(&fresh), contents(&changed));
    assert_ne!(contents(&fresh), first, "the stale copy was used");
    assert_eq!(files_in(&cache).len(), 2, "old copies are kept (nuvec does not evict)");
}

#[test]
fn an_aligned_file_is_used_in_place_and_nothing_is_written() {
    let dir = Scratch::new("inplace");
    let (src, cache) = (dir.0.join("model.safetensors"), dir.0.join("aligned"));
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    save_safetensors(&src, &[("w".to_string(), a)], None).unwrap();
    let file = open_through_cache(&src, Some(&cache)).unwrap();
    assert!(file.aligned());
    assert_eq!(file.path(), src.as_path());
    assert!(!cache.exists(), "a cache folder was made for an aligned file");
}

#[test]
fn a_cache_that_cannot_be_written_is_an_error_naming_the_knob() {
    let dir = Scratch::new("bad");
    let (src, cache) = (dir.0.join("model.safetensors"), dir.0.join("not-a-folder"));
    misaligned(&src, 3);
    fs::write(&cache, "a file where the cache folder should be").unwrap();
    let before = fs::read(&src).unwrap();
    let err = open_through_cache(&src, Some(&cache)).unwrap_err().to_string();
    assert!(err.contains("NUVEC_ALIGNED_CACHE") && err.contains("not-a-folder") && err.contains("unset it"), "{err}");
    assert_eq!(fs::read(&src).unwrap(), before);
    assert_eq!(fs::read_to_string(&cache).unwrap(), "a file where the cache folder should be");
}

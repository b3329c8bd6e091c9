//! Layer (b): values across ranks. Plain data is sent from the value's own memory and received
//! into the memory of the value the consumer will read; anything `serde` can encode goes
//! through postcard. What the communication thread needs of a type is erased into a
//! [`LandFn`]: make a buffer for `len` arriving bytes, and turn it into the value afterwards.

use std::any::Any;

use bytemuck::Pod;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A node's output, type-erased.
pub(crate) type AnyValue = Box<dyn Any + Send + Sync>;

/// Plain data that crosses ranks as its own bytes, with no encoding and no staging copy: the
/// sender's message reads the value's memory, the receiver's message writes the memory of the
/// `Vec` the value is made from.
///
/// Implemented for the primitive numbers, and for `Vec`s, boxed slices and arrays of any
/// [`bytemuck::Pod`] type. A type of your own that is plain data implements it in three lines,
/// also one that holds its elements in a `Vec`:
///
/// ```
/// use boundpool_ranks::PlainValue;
///
/// /// A tile of a matrix: its elements, row-major.
/// struct Tile(Vec<f64>);
///
/// impl PlainValue for Tile {
///     type Elem = f64;
///     fn as_slice(&self) -> &[f64] { &self.0 }
///     fn from_vec(v: Vec<f64>) -> Option<Self> { Some(Tile(v)) }
/// }
/// ```
pub trait PlainValue: Send + Sync + Sized + 'static {
    /// The element type, sent as its bytes (any bit pattern is a valid value).
    type Elem: Pod + Send + Sync;
    /// The elements to send, in place.
    fn as_slice(&self) -> &[Self::Elem];
    /// The value made from the received elements (`None`: this many elements cannot make one,
    /// for example a scalar from two).
    fn from_vec(v: Vec<Self::Elem>) -> Option<Self>;
    /// The `Vec` the value was made from, given back when a received value is dropped at its
    /// run's end, so that the same transfer's next value lands in memory already mapped
    /// instead of a fresh allocation's page faults (`None`, the default: not recycled).
    fn into_vec(self) -> Option<Vec<Self::Elem>> {
        None
    }
}

impl<E: Pod + Send + Sync> PlainValue for Vec<E> {
    type Elem = E;
    fn as_slice(&self) -> &[E] {
        self
    }
    fn from_vec(v: Vec<E>) -> Option<Self> {
        Some(v)
    }
    fn into_vec(self) -> Option<Vec<E>> {
        Some(self)
    }
}

impl<E: Pod + Send + Sync> PlainValue for Box<[E]> {
    type Elem = E;
    fn as_slice(&self) -> &[E] {
        self
    }
    fn from_vec(v: Vec<E>) -> Option<Self> {
        // The buffer was allocated with exactly this capacity: no reallocation.
        Some(v.into_boxed_slice())
    }
    fn into_vec(self) -> Option<Vec<E>> {
        Some(self.into_vec())
    }
}

impl<E: Pod + Send + Sync, const N: usize> PlainValue for [E; N] {
    type Elem = E;
    fn as_slice(&self) -> &[E] {
        self
    }
    fn from_vec(v: Vec<E>) -> Option<Self> {
        v.try_into().ok()
    }
}

macro_rules! plain_scalars {
    ($($t:ty),*) => {$(
        impl PlainValue for $t {
            type Elem = $t;
            fn as_slice(&self) -> &[$t] {
                std::slice::from_ref(self)
            }
            fn from_vec(v: Vec<$t>) -> Option<Self> {
                (v.len() == 1).then(|| v[0])
            }
        }
    )*};
}

plain_scalars!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, f32, f64);

/// The bytes of a plain value, in place.
pub(crate) fn plain_bytes<T: PlainValue>(v: &T) -> &[u8] {
    bytemuck::cast_slice(v.as_slice())
}

/// A serde value's bytes (postcard).
pub(crate) fn serde_bytes<T: Serialize>(v: &T) -> Result<Vec<u8>, String> {
    postcard::to_allocvec(v).map_err(|e| format!("cannot encode: {e}"))
}

/// What a landing made of the arrived bytes: the value and, where the landing keeps them (a
/// serde value this rank forwards to others of its host), the bytes as they arrived.
pub(crate) struct Landed {
    pub(crate) value: AnyValue,
    pub(crate) bytes: Option<Vec<u8>>,
}

/// A buffer that arriving bytes are written into, and the value made from it afterwards.
pub(crate) trait Landing: Send {
    /// Where the `len()` bytes go.
    fn ptr(&mut self) -> *mut u8;
    /// How many bytes arrive.
    fn len(&self) -> usize;
    /// The value.
    ///
    /// # Safety
    /// All `len()` bytes at `ptr()` have been written.
    unsafe fn finish(self: Box<Self>) -> Result<AnyValue, String>;
    /// The value, and the arrived bytes if this landing keeps them (by default it does not:
    /// a plain value is its bytes).
    ///
    /// # Safety
    /// As [`finish`](Self::finish).
    unsafe fn finish_landed(self: Box<Self>) -> Result<Landed, String> {
        // SAFETY: the caller's promise, passed on.
        unsafe { self.finish() }.map(|value| Landed { value, bytes: None })
    }
    /// Lands in `spare` (memory an earlier value of the same transfer gave back, see
    /// [`ReclaimFn`]) instead of a fresh allocation, if it fits exactly; before the first
    /// `ptr()`. Returns whether it took it.
    fn reuse(&mut self, spare: Spare) -> bool {
        let _ = spare;
        false
    }
}

/// Makes the landing for a message of `len` bytes (a plain function for host values; a
/// closure over the staging memory a device value lands in).
pub(crate) type LandFn =
    std::sync::Arc<dyn Fn(usize) -> Result<Box<dyn Landing>, String> + Send + Sync>;

/// A landing maker that needs nothing but the length (plain and serde values).
pub(crate) type LandPlain = fn(usize) -> Result<Box<dyn Landing>, String>;

/// A [`LandFn`] of a plain function.
pub(crate) fn land_fn(f: LandPlain) -> LandFn {
    std::sync::Arc::new(f)
}

/// The memory of a received value that its run no longer needs (a `Vec` of its elements).
pub(crate) type Spare = Box<dyn Any + Send>;

/// Gives a received value's memory back at its run's end (`PlainValue::into_vec`), for the
/// next value of the same transfer to land in.
pub(crate) type ReclaimFn = fn(AnyValue) -> Option<Spare>;

/// The [`ReclaimFn`] of a plain value of type `T`.
pub(crate) fn plain_reclaim<T: PlainValue>(v: AnyValue) -> Option<Spare> {
    let v = *v.downcast::<T>().ok()?;
    v.into_vec().map(|buf| Box::new(buf) as Spare)
}

/// A plain value's landing: a `Vec` of its elements, allocated at the first `ptr()` unless a
/// spare one of exactly this capacity was given (`reuse`).
struct PlainLanding<T: PlainValue> {
    buf: Vec<T::Elem>,
    elems: usize,
}

impl<T: PlainValue> Landing for PlainLanding<T> {
    fn ptr(&mut self) -> *mut u8 {
        if self.buf.capacity() < self.elems {
            self.buf = Vec::with_capacity(self.elems);
        }
        self.buf.as_mut_ptr().cast()
    }
    fn reuse(&mut self, spare: Spare) -> bool {
        match spare.downcast::<Vec<T::Elem>>() {
            Ok(mut v) if v.capacity() == self.elems && self.buf.capacity() == 0 => {
                v.clear();
                self.buf = *v;
                true
            }
            _ => false,
        }
    }
    fn len(&self) -> usize {
        self.elems * std::mem::size_of::<T::Elem>()
    }
    unsafe fn finish(mut self: Box<Self>) -> Result<AnyValue, String> {
        // A value of no bytes was never given a pointer.
        self.ptr();
        // SAFETY: the capacity is at least `elems` (`ptr` made it so), the caller wrote all their bytes
        // at `ptr()`, and `Elem: Pod` makes any bytes a valid element.
        unsafe { self.buf.set_len(self.elems) };
        let elems = self.elems;
        let buf = std::mem::take(&mut self.buf);
        T::from_vec(buf)
            .map(|v| Box::new(v) as AnyValue)
            .ok_or_else(|| {
                format!(
                    "{elems} elements of {} do not make a {}",
                    std::any::type_name::<T::Elem>(),
                    std::any::type_name::<T>()
                )
            })
    }
}

/// The landing of a plain value of type `T`.
pub(crate) fn plain_landing<T: PlainValue>(len: usize) -> Result<Box<dyn Landing>, String> {
    let size = std::mem::size_of::<T::Elem>();
    if size == 0 {
        return Err(format!(
            "{} has zero-sized elements, which cannot cross ranks",
            std::any::type_name::<T>()
        ));
    }
    if len % size != 0 {
        return Err(format!(
            "{len} bytes are not a whole number of {} ({size} bytes each)",
            std::any::type_name::<T::Elem>()
        ));
    }
    let elems = len / size;
    Ok(Box::new(PlainLanding::<T> {
        buf: Vec::new(),
        elems,
    }))
}

struct SerdeLanding<T> {
    buf: Vec<u8>,
    len: usize,
    /// Keep the encoded bytes beside the value (`finish_landed`): this rank forwards them.
    keep: bool,
    _t: std::marker::PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> SerdeLanding<T> {
    fn decode(&self) -> Result<T, String> {
        postcard::from_bytes::<T>(&self.buf).map_err(|e| {
            format!(
                "cannot decode {} bytes as {}: {e}",
                self.len,
                std::any::type_name::<T>()
            )
        })
    }
}

impl<T: DeserializeOwned + Send + Sync + 'static> Landing for SerdeLanding<T> {
    fn ptr(&mut self) -> *mut u8 {
        self.buf.as_mut_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
    unsafe fn finish(mut self: Box<Self>) -> Result<AnyValue, String> {
        // SAFETY: the capacity is `len` and the caller wrote all of it.
        unsafe { self.buf.set_len(self.len) };
        self.decode().map(|v| Box::new(v) as AnyValue)
    }
    unsafe fn finish_landed(mut self: Box<Self>) -> Result<Landed, String> {
        // SAFETY: the capacity is `len` and the caller wrote all of it.
        unsafe { self.buf.set_len(self.len) };
        let value = Box::new(self.decode()?) as AnyValue;
        let bytes = self.keep.then(|| std::mem::take(&mut self.buf));
        Ok(Landed { value, bytes })
    }
}

/// The landing of a serde value of type `T`.
pub(crate) fn serde_landing<T: DeserializeOwned + Send + Sync + 'static>(
    len: usize,
) -> Result<Box<dyn Landing>, String> {
    Ok(Box::new(SerdeLanding::<T> {
        buf: Vec::with_capacity(len),
        len,
        keep: false,
        _t: std::marker::PhantomData,
    }))
}

/// The landing of a serde value of type `T` that this rank forwards: the encoded bytes stay
/// beside the decoded value, and the forwarding send sends them as they arrived.
pub(crate) fn serde_landing_kept<T: DeserializeOwned + Send + Sync + 'static>(
    len: usize,
) -> Result<Box<dyn Landing>, String> {
    Ok(Box::new(SerdeLanding::<T> {
        buf: Vec::with_capacity(len),
        len,
        keep: true,
        _t: std::marker::PhantomData,
    }))
}

/// Writes `bytes` into a landing (the in-process paths and tests).
#[cfg(test)]
pub(crate) fn land_bytes(make: LandPlain, bytes: &[u8]) -> Result<AnyValue, String> {
    let mut l = make(bytes.len())?;
    // SAFETY: the landing has room for `bytes.len()` bytes, all written here.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), l.ptr(), bytes.len());
        l.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_plain<T: PlainValue + PartialEq + std::fmt::Debug + Clone>(v: T) {
        let bytes = plain_bytes(&v).to_vec();
        let back = land_bytes(plain_landing::<T>, &bytes).unwrap();
        assert_eq!(back.downcast_ref::<T>().unwrap(), &v);
    }

    #[test]
    fn plain_values_round_trip() {
        round_plain(7u64);
        round_plain(-3.5f32);
        round_plain(vec![1u16, 2, 3]);
        round_plain(Vec::<f64>::new());
        round_plain([1u8, 2, 3, 4]);
        round_plain(vec![[1i32, 2], [3, 4]].into_boxed_slice());
    }

    #[test]
    fn a_reclaimed_value_is_landed_in_again() {
        let spare = |v: Vec<u32>| plain_reclaim::<Vec<u32>>(Box::new(v)).expect("a Vec gives it");
        // Another size does not take it.
        let mut other = plain_landing::<Vec<u32>>(4 * 999).unwrap();
        assert!(!other.reuse(spare(vec![7u32; 1000])));
        let mut l = plain_landing::<Vec<u32>>(4000).unwrap();
        let s = spare(vec![7u32; 1000]);
        let addr2 = s.downcast_ref::<Vec<u32>>().unwrap().as_ptr();
        assert!(l.reuse(s));
        assert_eq!(
            l.ptr().cast::<u32>().cast_const(),
            addr2,
            "lands in the spare"
        );
        let bytes = plain_bytes(&vec![9u32; 1000]).to_vec();
        // SAFETY: the landing has room for the 4000 bytes, all written here.
        let back = unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), l.ptr(), bytes.len());
            l.finish()
        }
        .unwrap();
        let back = back.downcast_ref::<Vec<u32>>().unwrap();
        assert_eq!((back.as_ptr(), back.len(), back[999]), (addr2, 1000, 9));
        // Scalars and arrays are not recycled.
        assert!(plain_reclaim::<u64>(Box::new(5u64)).is_none());
        assert!(plain_reclaim::<[u8; 4]>(Box::new([1u8; 4])).is_none());
    }

    #[test]
    fn plain_sends_point_into_the_value() {
        let v = vec![5u32; 10];
        let b = plain_bytes(&v);
        assert_eq!(b.as_ptr(), v.as_ptr().cast());
        assert_eq!(b.len(), 40);
    }

    #[test]
    fn plain_size_mismatches_are_errors() {
        let e = land_bytes(plain_landing::<Vec<u32>>, &[0u8; 6]).unwrap_err();
        assert!(e.contains("6 bytes are not a whole number of u32"), "{e}");
        let e = land_bytes(plain_landing::<u64>, &[0u8; 16]).unwrap_err();
        assert!(e.contains("2 elements of u64 do not make a u64"), "{e}");
        assert!(plain_landing::<Vec<()>>(0).is_err());
    }

    #[test]
    fn serde_values_round_trip_and_bad_bytes_fail() {
        let v = (String::from("tile"), vec![1.5f64, 2.5], Some(3u8));
        let bytes = serde_bytes(&v).unwrap();
        let back = land_bytes(serde_landing::<(String, Vec<f64>, Option<u8>)>, &bytes).unwrap();
        assert_eq!(
            back.downcast_ref::<(String, Vec<f64>, Option<u8>)>()
                .unwrap(),
            &v
        );
        // Kept for forwarding: the bytes as they arrived, beside the value.
        let mut l = serde_landing_kept::<(String, Vec<f64>, Option<u8>)>(bytes.len()).unwrap();
        // SAFETY: the landing has room for `bytes.len()` bytes, all written here.
        let landed = unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), l.ptr(), bytes.len());
            l.finish_landed()
        }
        .unwrap();
        assert_eq!(landed.bytes.as_deref(), Some(&bytes[..]));
        assert_eq!(
            landed
                .value
                .downcast_ref::<(String, Vec<f64>, Option<u8>)>()
                .unwrap(),
            &v
        );
        let e = land_bytes(serde_landing::<String>, &[200u8]).unwrap_err();
        assert!(
            e.contains("cannot decode 1 bytes as alloc::string::String"),
            "{e}"
        );
    }
}

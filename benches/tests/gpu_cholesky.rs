//! The tiled Cholesky ([`boundpool_bench::cholesky`]) on a GPU pool: the factorization of a
//! small matrix verified on the device in every placement, a tile that is not positive
//! definite named in the error, and the tile routines' checks of their views. Run on a GPU machine with `BOUNDPOOL_REQUIRE_GPU=1`; without a
//! GPU each test says so and passes.

use std::sync::Arc;

use boundpool_bench::cholesky::{
    residual_on_device, spd_entry, spd_matrix, CholeskyPlan, Mat, TileBlas, Trans, Vector,
};
use boundpool_gpu::{GpuErrorKind, GpuPool};
use boundpool_test_support::{gpu_pool, gpu_pool_builder, GpuTest};

/// Makes the test matrix on the device (and a work copy).
fn upload(
    pool: &GpuPool,
    n: usize,
    poison: Option<usize>,
) -> (
    Arc<boundpool_gpu::DeviceBuffer<f64>>,
    Arc<boundpool_gpu::DeviceBuffer<f64>>,
) {
    let dev = pool.devices()[0].clone();
    let mut host = spd_matrix(n);
    if let Some(p) = poison {
        host[p * n + p] = -1000.0;
    }
    let a0 = Arc::new(pool.call(&dev, move |ctx| Ok(ctx.upload(&host)?)).unwrap());
    let src = a0.clone();
    let a = Arc::new(
        pool.call(&dev, move |ctx| {
            let mut a = ctx.alloc::<f64>(n * n)?;
            ctx.copy_device(&src, &mut a)?;
            Ok(a)
        })
        .unwrap(),
    );
    (a0, a)
}

#[test]
fn small_tiled_cholesky_verifies() {
    let Some(_t) = GpuTest::start("small_tiled_cholesky_verifies", 180) else {
        return;
    };
    // 1000 = 7 tiles of 128 and one of 104: the ragged edge is covered too.
    let n = 1000;
    // The last: one TRSM and one GEMM per column (`merge_columns`), ragged edge included.
    // The fourth: the critical path at normal priority (`critical_high` off).
    for (groups, handoff, merge_columns, critical_high) in [
        (2, false, false, true),
        (1, true, false, true),
        (2, false, true, true),
        (2, false, false, false),
    ] {
        let pool = gpu_pool_builder(4, groups)
            .stream_priority(0, -5)
            .stream_handoff(handoff)
            .blas(true)
            .solver(true)
            .build()
            .unwrap();
        let dev = pool.devices()[0].clone();
        let (a0, a) = upload(&pool, n, None);
        let info = Arc::new(
            pool.call(&dev, |ctx| Ok(ctx.alloc_zeros::<i32>(8)?))
                .unwrap(),
        );
        let plan = CholeskyPlan {
            n,
            tile: 128,
            panel: dev.groups()[0],
            update: *dev.groups().last().unwrap(),
            merge_columns,
            critical_high,
            critical_only_panel: false,
        };
        let chol = plan.build("small", &a, &info).unwrap();
        let counts = if merge_columns {
            [8, 7, 28, 21]
        } else {
            [8, 28, 28, 56]
        };
        assert_eq!(chol.counts, counts);
        pool.submit(&chol.graph).unwrap().wait().unwrap();
        let r = residual_on_device(&pool, &dev, &a0, &a, n).unwrap();
        eprintln!(
            "groups {groups}, hand-off {handoff}, merged {merge_columns}, critical high \
             {critical_high}: residual {r:.3e}"
        );
        assert!(r <= 1e-12, "residual {r:e}");
        // A spot value of L: L_00 = sqrt(A_00).
        let l = pool.download(&a).unwrap();
        assert!((l[0] - spd_entry(n, 0, 0).sqrt()).abs() < 1e-12);
        // The upper triangle was not touched.
        assert_eq!(l[5 * n + 1], spd_entry(n, 1, 5));
    }
}

#[test]
fn non_spd_tile_gives_the_named_error() {
    let Some(_t) = GpuTest::start_without_context_check("non_spd_tile_gives_the_named_error", 120)
    else {
        return;
    };
    let pool = gpu_pool("blas", 4, 1);
    let dev = pool.devices()[0].clone();
    let n = 256;
    // Element 130 is the third of tile 2 (rows 128..192).
    let (_a0, a) = upload(&pool, n, Some(130));
    let info = Arc::new(
        pool.call(&dev, |ctx| Ok(ctx.alloc_zeros::<i32>(4)?))
            .unwrap(),
    );
    let chol = CholeskyPlan::new(n, 64, dev.group())
        .build("not spd", &a, &info)
        .unwrap();
    let e = pool
        .submit(&chol.graph)
        .unwrap()
        .wait()
        .expect_err("not positive definite");
    let msg = e.to_string();
    eprintln!("error: {msg}");
    assert!(msg.contains("potrf(2)"), "{msg}");
    assert!(msg.contains("info = 3"), "{msg}");
    assert!(msg.contains("not positive definite"), "{msg}");
}

/// The tile routines check their views: a matrix or vector past its slice's end is refused when
/// made, and operands whose shapes do not fit a call are an error naming the node and the call,
/// before any library call.
#[test]
fn tile_routines_refuse_what_does_not_fit() {
    let Some(_t) = GpuTest::start("tile_routines_refuse_what_does_not_fit", 120) else {
        return;
    };
    let pool = gpu_pool("blas", 1, 1);
    let dev = pool.devices()[0].clone();
    let msg = pool
        .call(&dev, |ctx| {
            let a = ctx.alloc_zeros::<f64>(16)?;
            let data = a.as_cuda_slice();
            // 4×4 at element 1: its last element one past the end.
            let past = Mat::new(data, 1, 4, 4, 4).expect_err("past the end");
            assert_eq!(past.kind(), GpuErrorKind::InvalidArgument, "{past}");
            assert!(
                Mat::new(data, 0, 4, 4, 3).is_err(),
                "a leading dimension under the rows"
            );
            // The diagonal of a 4×4 matrix fits; one element on, it does not.
            assert!(Vector::new(data, 0, 4, 5).is_ok());
            assert!(Vector::new(data, 1, 4, 5).is_err());
            let (m4, m2) = (Mat::new(data, 0, 4, 4, 4)?, Mat::new(data, 0, 2, 2, 4)?);
            // SAFETY: refused before any library call (the shapes do not fit).
            let e =
                unsafe { TileBlas::new(ctx)?.gemm(Trans::No, Trans::No, 1.0, &m4, &m2, 0.0, &m4) }
                    .expect_err("a 2x2 B for a 4x4 C");
            assert_eq!(e.kind(), GpuErrorKind::InvalidArgument, "{e}");
            Ok(e.to_string())
        })
        .unwrap();
    assert!(msg.starts_with("node 'call' of graph"), "{msg}");
    assert!(msg.contains("cublasDgemm"), "{msg}");
}

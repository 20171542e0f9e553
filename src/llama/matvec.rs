//! How fast this host's CPU multiplies a quantized weight matrix by one
//! token's activations, with ggml's own kernel (the one a decode runs, and
//! like bmoe's models without repacking): bytes of weights per second. The
//! forecast (`bmoe inspect --forecast`) turns a token's weight bytes into its
//! compute time with it.

use std::time::{Duration, Instant};

use llama_cpp_sys_2 as sys;

use super::error::LlamaError;
use super::quant::{quantize, GgmlType};

/// The weight matrix measured: large enough to leave the caches, as a
/// model's weights do.
const MATRIX_BYTES: u64 = 64 << 20;
/// The longest row probed (a header's `embedding_length` is not trusted).
const MAX_ROW: u64 = 1 << 16;

/// Weight bytes per second of `y = W x` for a `ty` matrix with rows of
/// `ne0` values, on `threads` threads, over at least `min_time` (and at
/// least 3 products after one warm-up).
pub fn weight_bytes_per_s(
    ty: GgmlType,
    ne0: u64,
    threads: u32,
    min_time: Duration,
) -> Result<f64, LlamaError> {
    if ne0 == 0 || ne0 > MAX_ROW {
        return Err(LlamaError::Quant(format!(
            "the kernel probe takes rows of 1..={MAX_ROW} values, not {ne0}"
        )));
    }
    let row = quantized_row(ty, ne0)?;
    let rows = (MATRIX_BYTES / row.len() as u64).max(1);
    let w_bytes = row.len() as u64 * rows;
    // The matrix, the vector, the result and the graph, with room to spare.
    let ctx = ggml_context(w_bytes + ne0 * 4 + rows * 4 + (8 << 20))?;
    let shape = MatrixShape { ne0, rows };
    let res = measure(ctx, ty, shape, &row, Timing { threads, min_time });
    // SAFETY: `ctx` came from ggml_init and is freed once.
    unsafe { sys::ggml_free(ctx) };
    res.map(|per_product| w_bytes as f64 / per_product.as_secs_f64())
}

/// A ggml context owning `bytes` of memory (the caller frees it).
fn ggml_context(bytes: u64) -> Result<*mut sys::ggml_context, LlamaError> {
    let params = sys::ggml_init_params {
        mem_size: bytes as usize,
        mem_buffer: std::ptr::null_mut(),
        no_alloc: false,
    };
    // SAFETY: a plain parameter struct; ggml allocates the arena it owns.
    let ctx = unsafe { sys::ggml_init(params) };
    if ctx.is_null() {
        return Err(LlamaError::Quant(format!(
            "ggml_init of {bytes} bytes failed"
        )));
    }
    Ok(ctx)
}

/// One row of `ty` quantized from a fixed pattern (the kernel's speed does
/// not depend on the values).
fn quantized_row(ty: GgmlType, ne0: u64) -> Result<Vec<u8>, LlamaError> {
    let src: Vec<f32> = (0..ne0).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
    let mut row = Vec::new();
    quantize(ty, &src, ne0, &mut row)?;
    Ok(row)
}

/// A probe matrix: values per row, and rows.
#[derive(Debug, Clone, Copy)]
struct MatrixShape {
    ne0: u64,
    rows: u64,
}

/// How a product is timed: on `threads`, for at least `min_time`.
#[derive(Debug, Clone, Copy)]
struct Timing {
    threads: u32,
    min_time: Duration,
}

/// How often a graph is computed: at least `reps` times and `min_time`.
#[derive(Debug, Clone, Copy)]
struct Repeat {
    reps: u32,
    min_time: Duration,
}

/// The time of one product, in `ctx`.
fn measure(
    ctx: *mut sys::ggml_context,
    ty: GgmlType,
    shape: MatrixShape,
    row: &[u8],
    timing: Timing,
) -> Result<Duration, LlamaError> {
    let MatrixShape { ne0, rows } = shape;
    let Timing { threads, min_time } = timing;
    // `ctx` is a live context with room for these tensors (sized by the
    // caller); each tensor's data is `nbytes` writable bytes inside it.
    // SAFETY: as the comment above says.
    unsafe {
        let w = sys::ggml_new_tensor_2d(ctx, ty.0, ne0 as i64, rows as i64);
        let x = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_F32, ne0 as i64);
        if w.is_null() || x.is_null() {
            return Err(LlamaError::Quant(
                "the kernel probe's tensors do not fit".into(),
            ));
        }
        let wd = std::slice::from_raw_parts_mut((*w).data as *mut u8, sys::ggml_nbytes(w));
        for chunk in wd.chunks_exact_mut(row.len()) {
            chunk.copy_from_slice(row);
        }
        let xd = std::slice::from_raw_parts_mut((*x).data as *mut f32, ne0 as usize);
        xd.fill(0.5);
        let graph = sys::ggml_new_graph(ctx);
        sys::ggml_build_forward_expand(graph, sys::ggml_mul_mat(ctx, w, x));
        let repeat = Repeat { reps: 3, min_time };
        Ok(time_graph(graph, threads, repeat))
    }
}

/// The mean time of one compute of `graph` on a sleeping pool of `threads`
/// (poll 0, as bmoe's contexts use) with a work buffer of its own, over at
/// least `reps` computes and `min_time`, after one warm-up.
///
/// # Safety
/// `graph` is a live graph whose tensors are allocated and stay so.
unsafe fn time_graph(graph: *mut sys::ggml_cgraph, threads: u32, repeat: Repeat) -> Duration {
    let Repeat { reps, min_time } = repeat;
    // The pool and the work buffer outlive every compute and are freed once,
    // after the last; `graph` is live (the caller's contract).
    // SAFETY: as the comment above says.
    unsafe {
        let mut tpp = sys::ggml_threadpool_params_default(threads as i32);
        tpp.poll = 0;
        let pool = sys::ggml_threadpool_new(&mut tpp);
        let mut plan = sys::ggml_graph_plan(graph, threads as i32, pool);
        let mut work = vec![0u8; plan.work_size.max(1)];
        plan.work_data = work.as_mut_ptr();
        sys::ggml_graph_compute(graph, &mut plan);
        let (t0, mut n) = (Instant::now(), 0u32);
        while n < reps || t0.elapsed() < min_time {
            sys::ggml_graph_compute(graph, &mut plan);
            n += 1;
        }
        let per = t0.elapsed() / n;
        if !pool.is_null() {
            sys::ggml_threadpool_free(pool);
        }
        per
    }
}

/// The fixed cost of one graph compute on a sleeping thread pool (poll 0, as
/// bmoe's contexts use): a streamed decode's graph is computed in one such
/// segment per routed layer (the hook stops it at each layer's routing), so
/// every MoE layer adds one wake-up of the pool.
pub fn segment_cost(threads: u32) -> Result<Duration, LlamaError> {
    const REPS: u32 = 200;
    let ctx = ggml_context(4 << 20)?;
    // `ctx` is live and large enough for two tiny tensors, their product and
    // a graph (the work buffer is `time_graph`'s own); it is freed once, last.
    // SAFETY: as the comment above says.
    let per = unsafe {
        let w = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_F32, 64, 64);
        let x = sys::ggml_new_tensor_1d(ctx, sys::GGML_TYPE_F32, 64);
        let graph = sys::ggml_new_graph(ctx);
        sys::ggml_build_forward_expand(graph, sys::ggml_mul_mat(ctx, w, x));
        let repeat = Repeat {
            reps: REPS,
            min_time: Duration::ZERO,
        };
        let per = time_graph(graph, threads, repeat);
        sys::ggml_free(ctx);
        per
    };
    Ok(per)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quantized_product_runs_at_a_plausible_rate() {
        let q = weight_bytes_per_s(GgmlType::Q8_0, 576, 1, Duration::from_millis(50)).unwrap();
        // Between 10 MB/s and 1 TB/s: it ran and the arithmetic is per second.
        assert!((1e7..1e12).contains(&q), "{q}");
        let e = weight_bytes_per_s(GgmlType::Q8_0, 100, 1, Duration::ZERO).unwrap_err();
        assert!(e.to_string().contains("rows"), "{e}");
        let seg = segment_cost(2).unwrap();
        assert!(
            seg > Duration::ZERO && seg < Duration::from_millis(50),
            "{seg:?}"
        );
    }
}

//! The one deterministic generator of the tests, benches and tools: `tests/common` re-exports it,
//! `benches/decode.rs`, `benches/swar.rs` and `dev/src/lib.rs` (the training tools) include this
//! file with `#[path]`.
#![allow(dead_code)]

/// xorshift64* (Vigna): deterministic test data. The state must not be zero.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `[-m, m]`.
    pub fn sym(&mut self, m: i64) -> i64 {
        (self.next() % (2 * m as u64 + 1)) as i64 - m
    }
    /// `n` values uniform in `[-m, m]` (m < 2^31).
    pub fn vec(&mut self, n: usize, m: i64) -> Vec<i32> {
        (0..n).map(|_| self.sym(m) as i32).collect()
    }
    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Roughly normal (a sum of four uniforms), standard deviation `sd`.
    pub fn normal(&mut self, sd: f64) -> f64 {
        let s: f64 = (0..4).map(|_| self.unit()).sum::<f64>() - 2.0;
        s * sd * 3f64.sqrt()
    }
    /// Uniform in the open interval `(0, 1)`.
    pub fn open_unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    /// `n` weights like a trained layer's: normal with standard deviation `sd`, and about one in
    /// 500 an outlier of standard deviation `8 sd`.
    pub fn weights(&mut self, n: usize, sd: f64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                (if self.next() % 500 == 0 {
                    self.normal(sd * 8.0)
                } else {
                    self.normal(sd)
                }) as f32
            })
            .collect()
    }
    /// `n` activations as after RMSNorm: normal, with outlier channels 40 times larger (every
    /// column `j` with `j % 97 == 5`).
    pub fn activations(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|j| (self.normal(1.0) * if j % 97 == 5 { 40.0 } else { 1.0 }) as f32)
            .collect()
    }
    /// Standard normal (the Box–Muller transform of two [`open_unit`](Self::open_unit) draws).
    pub fn gaussian(&mut self) -> f64 {
        (-2.0 * self.open_unit().ln()).sqrt() * (std::f64::consts::TAU * self.open_unit()).cos()
    }
}

//! Calls kept going while something changes under them (a key rotated, a
//! token endpoint down): a few loops, each making one call after another
//! until told to stop, every answer kept with the instant it came.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::task::JoinHandle;

/// Loops making calls; what each call gave, in the order it came.
pub struct Loops<T> {
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<(Instant, T)>>>,
    loops: Vec<JoinHandle<()>>,
}

impl<T: Clone + Send + 'static> Loops<T> {
    /// Starts `n` loops; loop `i` makes `call(i)` again and again.
    pub fn start<F, Fut>(n: usize, call: F) -> Self
    where
        F: Fn(usize) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = T> + Send,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(Mutex::new(Vec::new()));
        let call = Arc::new(call);
        let loops = (0..n)
            .map(|i| {
                let (stop, answers, call) = (stop.clone(), answers.clone(), call.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::SeqCst) {
                        let answer = call(i).await;
                        answers.lock().unwrap().push((Instant::now(), answer));
                    }
                })
            })
            .collect();
        Self {
            stop,
            answers,
            loops,
        }
    }

    /// The answers so far.
    pub fn answers(&self) -> Vec<(Instant, T)> {
        self.answers.lock().unwrap().clone()
    }

    /// Stops the loops once their calls in flight are answered; every answer.
    pub async fn stop(self) -> Vec<(Instant, T)> {
        self.stop.store(true, Ordering::SeqCst);
        for l in self.loops {
            l.await.unwrap();
        }
        let answers = self.answers.lock().unwrap().clone();
        answers
    }
}

/// How many of `answers` are `ok` and how many are not.
pub fn tally<T>(answers: &[(Instant, T)], ok: impl Fn(&T) -> bool) -> (usize, usize) {
    let good = answers.iter().filter(|(_, a)| ok(a)).count();
    (good, answers.len() - good)
}

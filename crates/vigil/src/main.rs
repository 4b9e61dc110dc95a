//! The `vigil` binary.

fn main() {
    println!("vigil");
}

// Kernels from ROCm/rocm-examples (commit 7dfb7d4), copied unchanged as peer kernels for the
// emulator: Applications/histogram, Applications/prefix_sum, Applications/bitonic_sort,
// HIP-Basic/warp_shuffle. mxgemm compiles them header-free with tests/emu/peer_hip/hip_compat.h.
//
// MIT License
// 
// Copyright (C) 2022 Advanced Micro Devices, Inc. All rights reserved.
// 
// Permission is hereby granted, free of charge, to any person obtaining a copy of this software and associated documentation files (the "Software"), to deal in the Software without restriction, including without limitation the rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is furnished to do so, subject to the following conditions:
// 
// The above copyright notice and this permission notice shall be included in all copies or substantial portions of the Software.
// 
// THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.

// ---- Applications/histogram/main.hip
__global__ void
    histogram256_block(unsigned char* data, unsigned int* block_bins, const int items_per_thread)
{
    const int thread_id  = threadIdx.x;
    const int block_id   = blockIdx.x;
    const int block_size = blockDim.x;
    const int bin_size   = 256;

    // If thread_bins was an array of unsigned int, thread_bins could be
    // clustered by thread to reduce banking conflicts:
    // | t0 ... t128 | t0 ... t128 | ... | t0 ... t128 |
    // |    bin0     |    bin1     | ... |    bin255   |
    // Thread bins is of size: bin_size * block_size.
    extern __shared__ unsigned char thread_bins[];

    // However, we need to use unsigned char to save space, which is smaller
    // than 32-bit word unit stored per bank.  We can shuffle thread_id such
    // that  a wave  front  iterates through  thread_bins  with  a stride of
    // 4 elements (32-bits total). Example with 128 threads per block:
    //   0b0000_0000_0AAB_BBBBB into (   thread_id)
    //   0b0000_0000_0BBB_BBBAA      (sh_thread_id)
    // sh_thread_id is in the range [0; block_size)

    // If we assume that block_size is a power of two, then we can get the
    // length of B by finding the first '1' bit with '__ffs'.
    const int b_bits_length = __ffs(block_size) - 3;
    const int sh_thread_id
        = (thread_id & (1 << b_bits_length) - 1) << 2 | (thread_id >> b_bits_length);

    // Initialize 'thread_bins' to 0
    for(int i = 0; i < bin_size; ++i)
    {
        thread_bins[i + bin_size * sh_thread_id] = 0;
    }
    __syncthreads();

    for(int i = 0; i < items_per_thread; i++)
    {
        const unsigned int value = data[(block_id * block_size + thread_id) * items_per_thread + i];
        thread_bins[value * block_size + sh_thread_id]++;
    }
    __syncthreads();

    // Join the generated 256 bins from 128 threads by letting each thread sum 256 elements from 2 bins.
    const int bins_per_thread = bin_size / block_size;
    for(int i = 0; i < bins_per_thread; ++i)
    {
        // bin_sh_id is in the range [0; bin_size)
        const int bin_sh_id = i * block_size + sh_thread_id;

        // Accumulate bins.
        unsigned int bin_acc = 0;
        for(int j = 0; j < block_size; ++j)
        {
            // Sum the result from the j-th thread from the 'block_size'-sized 'bin_id'th bin.
            bin_acc += thread_bins[bin_sh_id * block_size + j];
        }

        block_bins[block_id * bin_size + bin_sh_id] = bin_acc;
    }
}

// ---- Applications/prefix_sum/main.hip
__global__ void block_prefix_sum(float* d_data, int size, int offset)
{
    const int thread_id  = threadIdx.x;
    const int block_id   = blockIdx.x;
    const int block_size = blockDim.x;

    const int x = (offset * (2 * (block_id * block_size + thread_id) + 1)) - 1;

    // Cache the computational window in shared memory
    extern __shared__ float block[];
    if(x < size)
    {
        block[2 * thread_id] = d_data[x];
    }
    if(x + offset < size)
    {
        block[2 * thread_id + 1] = d_data[x + offset];
    }

    // Build up tree
    int tree_offset = 1;
    for(int tree_size = size >> 1; tree_size > 0; tree_size >>= 1)
    {
        __syncthreads();
        if(thread_id < tree_size)
        {
            int from = tree_offset * (2 * thread_id + 1) - 1;
            int to   = tree_offset * (2 * thread_id + 2) - 1;
            block[to] += block[from];
        }
        tree_offset <<= 1;
    }

    if(size > 2)
    {
        if(tree_offset < size)
        {
            tree_offset <<= 1;
        }

        // Build down tree
        int max_thread = tree_offset >> 1;
        for(int tree_size = 0; tree_size < max_thread; tree_size <<= 1)
        {
            tree_size += 1;
            tree_offset >>= 1;
            __syncthreads();

            if(thread_id < tree_size)
            {
                int from = tree_offset * (thread_id + 1) - 1;
                int to   = from + (tree_offset >> 1);
                block[to] += block[from];
            }
        }
    }
    __syncthreads();

    // write the results back to global memory
    if(x < size)
    {
        d_data[x] = block[2 * thread_id];
    }
    if(x + offset < size)
    {
        d_data[x + offset] = block[2 * thread_id + 1];
    }
}
__global__ void device_prefix_sum(float* buffer, int size, int offset)
{
    const int thread_id  = threadIdx.x;
    const int block_size = blockDim.x;
    const int block_id   = blockIdx.x;

    const int sorted_blocks = offset / block_size;
    const int unsorted_block_id
        = block_id + (block_id / ((offset << 1) - sorted_blocks) + 1) * sorted_blocks;
    int x = (unsorted_block_id * block_size + thread_id);
    if(((x + 1) % offset != 0) && (x < size))
    {
        buffer[x] += buffer[x - (x % offset + 1)];
    }
}

// ---- Applications/bitonic_sort/main.hip
__global__ void bitonic_sort_kernel(unsigned int*      array,
                                    const unsigned int step,
                                    const unsigned int stage,
                                    bool               sort_increasing)
{
    // Current thread id.
    unsigned int thread_id = blockIdx.x * blockDim.x + threadIdx.x;

    // How many pairs of elements are ordered with the same criteria (increasingly or decreasingly)
    // within each of the bitonic subsequences computed in each step. E.g. in the step 0 we have
    // 1 pair of elements in each monotonic component of the bitonic subsequences, that is, we
    // obtain bitonic sequences of length 4.
    const unsigned int same_order_block_width = 1 << step;

    // Distance between the two elements that each thread sorts.
    const unsigned int pair_distance = 1 << (step - stage);

    // Total number of elements of each subsequence processed.
    const unsigned int sorted_block_width = 2 * pair_distance;

    // Compute indexes of the elements of the array that the thread will sort.
    const unsigned int left_id
        = (thread_id % pair_distance) + (thread_id / pair_distance) * sorted_block_width;
    const unsigned int right_id = left_id + pair_distance;

    // Get the elements of the array that the thread will sort.
    const unsigned int left_element  = array[left_id];
    const unsigned int right_element = array[right_id];

    // If the current thread is the first one ordering an element from the right component of the
    // bitonic sequence that it's computing, then the ordering criteria changes.
    if((thread_id / same_order_block_width) % 2 == 1)
        sort_increasing = !sort_increasing;

    // Compare elements and switch them if necessary.
    const unsigned int greater = (left_element > right_element) ? left_element : right_element;
    const unsigned int lesser  = (left_element > right_element) ? right_element : left_element;
    array[left_id]             = (sort_increasing) ? lesser : greater;
    array[right_id]            = (sort_increasing) ? greater : lesser;
}

// ---- HIP-Basic/warp_shuffle/main.hip
__global__ void matrix_transpose_kernel(float* out, const float* in, const unsigned int width)
{
    // Compute the row and column indexes of the matrix element that each thread is going
    // to process. Since in this example there is only one block, the indexes are
    // precisely the thread's ID in each dimension.
    const unsigned int x = threadIdx.x;
    const unsigned int y = threadIdx.y;

    // If not out of bounds, transpose element.
    if(x < width && y < width)
    {
        // Read element from global memory. Each thread in the warp is reading the element that
        // the thread with global id x * width + y will transpose.
        const float val = in[y * width + x];

        // Transpose element reading it from the correspondent thread with a shuffle operation (__shfl).
        // __shfl does not require all threads to be active, so it can be inside the if block.
        // Note that, since the matrix in this example has less elements than the warp size value,
        // the ID within the warp of each thread matches its global ID.
        out[x * width + y] = __shfl(val, y * width + x);
    }
}


/* A minimal shared library for the AOT cache tests.
 * Its answer is fixed at build time with -DRLX_TEST_VALUE=N, so a test can
 * tell which build a loaded library came from. */
#ifndef RLX_TEST_VALUE
#define RLX_TEST_VALUE 0
#endif

int rlx_test_value(void)
{
    return RLX_TEST_VALUE;
}
